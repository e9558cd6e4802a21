"""integrations: private_networks; audit_events: detail

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Integrations that exist already get no exception (the guard applies to them in full). The server default
    # only fills them in and is dropped then: PostgreSQL cannot compare JSON defaults, and the model sets the value.
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("private_networks", sa.JSON(), server_default=sa.text("'[]'"), nullable=False))
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.alter_column("private_networks", server_default=None)
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("detail", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_events", schema=None) as batch_op:
        batch_op.drop_column("detail")
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.drop_column("private_networks")
