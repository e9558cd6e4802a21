"""The built-in integration templates: one TOML file per provider in this folder."""

import functools
import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from credgate.specs import AuthSpec, BaseUrl, BearerAuth, Endpoint, HeaderMap, ProviderName, QueryMap

CATALOG_DIR = Path(__file__).parent
TemplateId = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,99}$")]


class Template(BaseModel):
    """A preset for an integration: base URL, auth placement, default headers and query, endpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: TemplateId
    provider: ProviderName
    name: str
    description: str = ""
    base_url: BaseUrl
    requires_base_url: bool = False  # the provider has a host per account (Azure): the setup must give it
    verify: Endpoint | None = None  # a cheap call that tells whether the provider accepts a key
    auth: AuthSpec = BearerAuth()
    endpoints: tuple[Endpoint, ...]
    headers: HeaderMap = Field(default_factory=dict)
    query: QueryMap = Field(default_factory=dict)


class CatalogError(Exception):
    """A template file is invalid; the message names the file and the field."""


def _templates_of(document: dict[str, Any]) -> list[Template]:
    shared = {key: value for key, value in document.items() if key != "templates"}
    return [Template.model_validate(shared | entry) for entry in document.get("templates", [])]


def load_templates(*folders: Path) -> dict[str, Template]:
    """Every template of the TOML files in `folders`, by id; later folders may not reuse an id."""
    templates: dict[str, Template] = {}
    for folder in folders:
        for path, loaded in _builtin_files() if folder == CATALOG_DIR else _files(folder):
            for template in loaded:
                if template.id in templates:
                    raise CatalogError(f"{path}: template id {template.id} is defined twice")
                templates[template.id] = template
    return templates


@functools.cache
def _builtin_files() -> tuple[tuple[Path, tuple[Template, ...]], ...]:
    """The built-in templates, read once a process: they ship with the package (and parsing them takes about
    30 ms, which every opened context paid)."""
    return _files(CATALOG_DIR)


def _files(folder: Path) -> tuple[tuple[Path, tuple[Template, ...]], ...]:
    return tuple((path, _file_templates(path)) for path in sorted(folder.glob("*.toml")))


def _file_templates(path: Path) -> tuple[Template, ...]:
    try:
        return tuple(_templates_of(tomllib.loads(path.read_text())))
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not valid TOML: {error}") from None
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in issue['loc'])}: {issue['msg']}" for issue in error.errors()
        )
        raise CatalogError(f"{path}: {problems}") from None


def builtin_templates() -> dict[str, Template]:
    return load_templates(CATALOG_DIR)


def all_templates(users_folder: Path) -> dict[str, Template]:
    """The built-in templates and the users' own (TOML files in `users_folder`, if it exists)."""
    return load_templates(CATALOG_DIR, *([users_folder] if users_folder.is_dir() else []))
