"""the audit log as a hash chain: each entry's previous_hash and hash, the entries already there chained in id
order, and the chain's head in meta

Revision ID: 0011
Revises: 0010

The hashes are credgate.audit_chain's, computed here in Python a page of entries at a time; the head row is
written with an inline literal, so an empty database's migration executes no statement with parameters.
"""

from collections.abc import Sequence
from datetime import UTC

import sqlalchemy as sa
from alembic import op

from credgate.audit_chain import GENESIS, chain_entry

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_AUDIT_HEAD = "audit_head"  # storage.repository.AUDIT_HEAD
_PAGE = 1000
_EVENTS = sa.table(
    "audit_events",
    sa.column("id", sa.Integer),
    sa.column("at", sa.DateTime(timezone=True)),
    *(sa.column(name, sa.String) for name in ("actor", "action", "project_id", "provider")),
    sa.column("detail", sa.JSON),
    sa.column("previous_hash", sa.String),
    sa.column("hash", sa.String),
)
_META = sa.table("meta", sa.column("name", sa.String), sa.column("value", sa.String))


def upgrade() -> None:
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("previous_hash", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("hash", sa.String(length=64), nullable=True))
    head = _chain_existing_entries(op.get_bind())
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.alter_column("previous_hash", existing_type=sa.String(length=64), nullable=False)
        batch_op.alter_column("hash", existing_type=sa.String(length=64), nullable=False)
        batch_op.create_index("ix_audit_events_previous_hash", ["previous_hash"], unique=True)
    op.execute(_META.insert().values(name=op.inline_literal(_AUDIT_HEAD), value=op.inline_literal(head)))


def downgrade() -> None:
    op.execute(_META.delete().where(_META.c.name == op.inline_literal(_AUDIT_HEAD)))
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_events_previous_hash")
        batch_op.drop_column("hash")
        batch_op.drop_column("previous_hash")


def _chain_existing_entries(connection: sa.Connection) -> str:
    """Chain the entries there are, oldest id first, a page at a time; the head's hash."""
    head, after = GENESIS, 0
    columns = [_EVENTS.c[name] for name in ("id", "at", "actor", "action", "project_id", "provider", "detail")]
    link = (
        _EVENTS.update()
        .where(_EVENTS.c.id == sa.bindparam("entry_id"))
        .values(previous_hash=sa.bindparam("new_previous_hash"), hash=sa.bindparam("new_hash"))
    )
    while True:
        page = connection.execute(
            sa.select(*columns).where(_EVENTS.c.id > after).order_by(_EVENTS.c.id).limit(_PAGE)
        ).all()
        if not page:
            return head
        links = []
        for entry_id, at, actor, action, project_id, provider, detail in page:
            entry = chain_entry(
                at=at if at.tzinfo is not None else at.replace(tzinfo=UTC),  # SQLite keeps UTC without a zone
                actor=actor,
                action=action,
                project_id=project_id,
                provider=provider,
                detail=detail,
                previous_hash=head,
            )
            head = entry["hash"]
            links.append({"entry_id": entry_id, "new_previous_hash": entry["previous_hash"], "new_hash": head})
        connection.execute(link, links)
        after = page[-1][0]
