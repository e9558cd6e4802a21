"""admin_sessions: the panel state (messages, one-time secret, pending set-up)

Revision ID: 0006
Revises: 0005
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # All nullable: sessions that exist already simply hold no state. The secrets are ciphertexts.
    with op.batch_alter_table("admin_sessions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("flash_messages", sa.JSON(none_as_null=True), nullable=True))
        batch_op.add_column(sa.Column("flash_secret", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("flash_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("pending_setup", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("pending_setup_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("admin_sessions", schema=None) as batch_op:
        for column in ("pending_setup_at", "pending_setup", "flash_at", "flash_secret", "flash_messages"):
            batch_op.drop_column(column)
