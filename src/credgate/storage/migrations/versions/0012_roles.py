"""roles: each admin token's and panel user's role (owner, project_admin, viewer) and granted projects; the
tokens and users already there become owners, as they were in effect

Revision ID: 0012
Revises: 0011
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("admin_tokens", "admin_users")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("role", sa.String(length=16), nullable=False, server_default=sa.text("'owner'")))
            batch.add_column(sa.Column("project_ids", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
        with op.batch_alter_table(table) as batch:  # the defaults were for the rows already there
            batch.alter_column("role", server_default=None)
            batch.alter_column("project_ids", server_default=None)


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("project_ids")
            batch.drop_column("role")
