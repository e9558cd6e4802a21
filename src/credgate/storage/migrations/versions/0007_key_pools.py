"""provider_keys: a pool of keys per integration, each with a stable id, a label, an order and a state

Revision ID: 0007
Revises: 0006

The table gets a primary key of its own (it was the integration's id), so it is rebuilt: a new table, the rows
copied (each existing key becomes its integration's first key, with a new id), the old table dropped. Downgrading
keeps each integration's first key only.
"""

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEPT = ("integration_id", "ciphertext", "master_key_id", "hint", "updated_at")


def _new_key_id() -> str:
    return "key_" + secrets.token_hex(12)  # as services.provider_keys makes them


def upgrade() -> None:
    op.create_table(
        "provider_keys_v7",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("integration_id", sa.String(length=32), nullable=False),
        sa.Column("label", sa.String(length=64), server_default=sa.text("''"), nullable=False),
        sa.Column("position", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=True),
        sa.Column("master_key_id", sa.String(length=16), nullable=True),
        sa.Column("hint", sa.String(length=8), nullable=True),
        sa.Column("disabled", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failure", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["integration_id"], ["integrations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_provider_keys"),
    )
    old = sa.table("provider_keys", *(sa.column(name) for name in _KEPT))
    new = sa.table("provider_keys_v7", sa.column("id"), sa.column("created_at"), *(sa.column(name) for name in _KEPT))
    connection = op.get_bind()
    for row in connection.execute(sa.select(old)).mappings().all():
        # The key's age is unknown: its last change is the best known bound.
        connection.execute(sa.insert(new).values(id=_new_key_id(), created_at=row["updated_at"], **row))
    with op.batch_alter_table("provider_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_provider_keys_master_key_id")
    op.drop_table("provider_keys")
    op.rename_table("provider_keys_v7", "provider_keys")
    with op.batch_alter_table("provider_keys", schema=None) as batch_op:
        batch_op.create_index("ix_provider_keys_master_key_id", ["master_key_id"], unique=False)
        batch_op.create_index("ix_provider_keys_integration_id", ["integration_id"], unique=False)
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("key_strategy", sa.String(length=16), server_default=sa.text("'failover'"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.drop_column("key_strategy")
    op.create_table(
        "provider_keys_v6",
        sa.Column("integration_id", sa.String(length=32), nullable=False),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=True),
        sa.Column("master_key_id", sa.String(length=16), nullable=True),
        sa.Column("hint", sa.String(length=8), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["integration_id"], ["integrations.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("integration_id"),
    )
    pool = sa.table("provider_keys", sa.column("position"), sa.column("id"), *(sa.column(name) for name in _KEPT))
    old = sa.table("provider_keys_v6", *(sa.column(name) for name in _KEPT))
    connection = op.get_bind()
    kept: set[str] = set()
    for row in connection.execute(sa.select(pool).order_by(pool.c.position, pool.c.id)).mappings().all():
        if row["integration_id"] not in kept:  # one key per integration: the first of its pool
            kept.add(row["integration_id"])
            connection.execute(sa.insert(old).values(**{name: row[name] for name in _KEPT}))
    with op.batch_alter_table("provider_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_provider_keys_integration_id")
        batch_op.drop_index("ix_provider_keys_master_key_id")
    op.drop_table("provider_keys")
    op.rename_table("provider_keys_v6", "provider_keys")
    with op.batch_alter_table("provider_keys", schema=None) as batch_op:
        batch_op.create_index("ix_provider_keys_master_key_id", ["master_key_id"], unique=False)
