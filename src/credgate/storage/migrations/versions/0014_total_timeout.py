"""integrations: total_timeout_seconds

Revision ID: 0014
Revises: 0013
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The server default gives integrations that exist already the default of an hour.
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("total_timeout_seconds", sa.Double(), server_default=sa.text("3600"), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.drop_column("total_timeout_seconds")
