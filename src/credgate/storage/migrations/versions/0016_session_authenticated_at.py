"""admin_sessions: authenticated_at

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The default serves instances still running the code before this one, during a rolling upgrade: their
    # sign-ins name no `authenticated_at`.
    with op.batch_alter_table("admin_sessions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("authenticated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())
        )
    op.execute("UPDATE admin_sessions SET authenticated_at = created_at")  # each was opened by a sign-in


def downgrade() -> None:
    with op.batch_alter_table("admin_sessions", schema=None) as batch_op:
        batch_op.drop_column("authenticated_at")
