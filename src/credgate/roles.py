"""Who may do what in the admin plane: an admin's Role and the projects it was granted, decided without I/O.

| role            | read a project                  | change a project | create/delete projects, admins, audit export |
|-----------------|---------------------------------|------------------|----------------------------------------------|
| `owner`         | every one                       | every one        | yes                                          |
| `project_admin` | its granted ones                | its granted ones | no                                           |
| `viewer`        | its granted ones; none = every  | none             | no                                           |

Reading what belongs to no project (the whole audit log, the metrics' totals) needs a principal that may read
every project: an owner or a viewer granted no list. The admin API, the panel and the CLI's grants all ask here.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from credgate.errors import Forbidden, InvalidInput


class Role(StrEnum):
    OWNER = "owner"
    PROJECT_ADMIN = "project_admin"
    VIEWER = "viewer"


ROLES = tuple(role.value for role in Role)


def checked_grant(role: str, project_ids: Iterable[str]) -> tuple[Role, list[str]]:
    """The role and its projects as stored, or InvalidInput: an owner holds no list, a project admin at least one."""
    if role not in ROLES:
        raise InvalidInput("role", f"must be one of {', '.join(ROLES)}")
    granted = sorted(set(project_ids))
    if role == Role.OWNER and granted:
        raise InvalidInput("project_ids", "an owner may manage every project: grant no list")
    if role == Role.PROJECT_ADMIN and not granted:
        raise InvalidInput("project_ids", "a project admin needs at least one project")
    return Role(role), granted


@dataclass(frozen=True, slots=True)
class Principal:
    """The acting admin: its audit name, role and granted projects; `kind` names it in a refusal."""

    actor: str
    role: Role
    project_ids: frozenset[str] = frozenset()
    kind: str = "admin token"

    @classmethod
    def of(cls, *, actor: str, role: str, project_ids: Iterable[str], kind: str = "admin token") -> "Principal":
        return cls(actor=actor, role=Role(role), project_ids=frozenset(project_ids), kind=kind)

    def may_read(self, project_id: str | None) -> bool:
        """Whether it may see this project (None: what belongs to no project, such as the whole audit log)."""
        if self.role == Role.OWNER or (self.role == Role.VIEWER and not self.project_ids):
            return True
        return project_id is not None and project_id in self.project_ids

    def may_change(self, project_id: str) -> bool:
        return self.role == Role.OWNER or (self.role == Role.PROJECT_ADMIN and project_id in self.project_ids)

    def may_administer(self) -> bool:
        """Owner-only: create and delete projects, the audit export, admins (which the CLI manages)."""
        return self.role == Role.OWNER

    def require_read(self, project_id: str | None) -> None:
        if not self.may_read(project_id):
            what = f"reading project {project_id}" if project_id else "reading what belongs to every project"
            self._refuse(what)

    def require_change(self, project_id: str) -> None:
        if not self.may_change(project_id):
            self._refuse(f"changing project {project_id}")

    def require_owner(self, what: str) -> None:
        if not self.may_administer():
            self._refuse(what)

    def _refuse(self, what: str) -> None:
        raise Forbidden(f"this {self.kind}'s role ({self.role.value}) does not allow {what}")
