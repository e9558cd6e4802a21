"""Audit: the record of every change, newest first; it never holds a secret."""

from collections.abc import Sequence

from credgate.limits import ListLimit, within
from credgate.services.context import Context, plausible_id
from credgate.storage.models import AuditEvent


async def list_audit_events(ctx: Context, *, limit: int = 100, project_id: str | None = None) -> Sequence[AuditEvent]:
    within("limit", ListLimit, limit)
    if project_id is not None and not plausible_id(project_id):
        return []  # no project has such an id, so none of its events are
    async with ctx.database.transaction(write=False) as repo:
        return await repo.list_audit_events(limit=limit, project_id=project_id)
