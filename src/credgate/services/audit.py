"""Audit: the record of every change, newest first; it never holds a secret."""

from collections.abc import Sequence

from credgate.services.context import Context
from credgate.storage.models import AuditEvent


async def list_audit_events(ctx: Context, *, limit: int = 100, project_id: str | None = None) -> Sequence[AuditEvent]:
    async with ctx.database.transaction(write=False) as repo:
        return await repo.list_audit_events(limit=limit, project_id=project_id)
