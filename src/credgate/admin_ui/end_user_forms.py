"""The project page's "Browser and end users" form: its fields as the page shows them, and read back as the
project's changes (allowed origins one a line, each end user's rate limit, the identity provider it trusts)."""

from pydantic import ValidationError
from starlette.datastructures import FormData

from credgate.admin_ui.base import field
from credgate.errors import InvalidInput
from credgate.limits import RateLimitPerMinute, parse_int, within
from credgate.services.projects import ProjectChanges
from credgate.specs import IdentityProviderSpec, Origin
from credgate.storage.models import Project

# The identity provider's fields, as the page names them when one is missing.
IDENTITY_FIELDS = {"jwks_url": "the JWKS URL", "issuer": "the issuer", "audience": "the audience"}


def shown_fields(project: Project) -> dict[str, str]:
    """The form's fields filled with the project's current settings."""
    trusted = project.identity_provider or {}
    limit = project.subject_rate_limit_per_minute
    return {
        "allowed_origins": "\n".join(project.allowed_origins),
        "subject_rate_limit_per_minute": "" if limit is None else str(limit),
        **{name: str(trusted.get(name, "")) for name in IDENTITY_FIELDS},
    }


def typed_fields(form: FormData) -> dict[str, str]:
    """What the admin typed, to read and, when it is refused, to show back as it was."""
    origins = form.get("allowed_origins")
    typed = {name: field(form, name) for name in ("subject_rate_limit_per_minute", *IDENTITY_FIELDS)}
    return {"allowed_origins": origins.strip() if isinstance(origins, str) else ""} | typed


def _origin_lines(text: str) -> list[tuple[int, str]]:
    """The non-blank lines of the origins' text, with their line numbers."""
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def _identity_provider(typed: dict[str, str]) -> IdentityProviderSpec | None:
    """All three fields, or none (trust no identity provider); InvalidInput naming what is missing or wrong."""
    missing = [label for name, label in IDENTITY_FIELDS.items() if not typed[name]]
    if len(missing) == len(IDENTITY_FIELDS):
        return None
    if missing:
        names = " and ".join(missing)
        verb = "is" if len(missing) == 1 else "are"
        problem = f"{names} {verb} missing: fill in all three, or leave all three empty to trust no identity provider"
        raise InvalidInput("identity_provider", problem)
    try:
        return IdentityProviderSpec(**{name: typed[name] for name in IDENTITY_FIELDS})
    except ValidationError as error:
        first = error.errors(include_input=False)[0]
        problem = str(first["msg"]).removeprefix("Value error, ")
        raise InvalidInput(str(first["loc"][0]), problem[:1].lower() + problem[1:]) from None


def end_user_changes(typed: dict[str, str]) -> ProjectChanges:
    """The typed fields as the project's changes: every one replaced, an empty one turning its setting off."""
    limit = typed["subject_rate_limit_per_minute"]
    return ProjectChanges(
        allowed_origins=[line for _, line in _origin_lines(typed["allowed_origins"])],
        subject_rate_limit_per_minute=parse_int("subject_rate_limit_per_minute", RateLimitPerMinute, limit)
        if limit
        else None,
        identity_provider=_identity_provider(typed),
    )


def origins_error(typed: dict[str, str], error: InvalidInput) -> InvalidInput:
    """The service's refusal of the origins, naming the line at fault where one is (the service names the list)."""
    for number, line in _origin_lines(typed["allowed_origins"]):
        try:
            within("allowed_origins", Origin, line)
        except InvalidInput as refused:
            return InvalidInput("allowed_origins", f"line {number} {refused.problem}")
    return error
