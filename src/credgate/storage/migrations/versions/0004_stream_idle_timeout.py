"""integrations: stream_idle_timeout_seconds

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The server default gives integrations that exist already the default of 300 seconds.
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("stream_idle_timeout_seconds", sa.Double(), server_default=sa.text("300"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.drop_column("stream_idle_timeout_seconds")
