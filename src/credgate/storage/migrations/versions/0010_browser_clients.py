"""browser clients and end users: a project's allowed origins, its trusted identity provider and its limit per
end user; the subject of each request; budgets counted per subject

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("projects") as batch:
        batch.add_column(sa.Column("allowed_origins", sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
        batch.add_column(sa.Column("identity_provider", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("subject_rate_limit_per_minute", sa.Integer(), nullable=True))
    with op.batch_alter_table("projects") as batch:  # the default was for the rows already there
        batch.alter_column("allowed_origins", server_default=None)
    with op.batch_alter_table("request_records") as batch:
        batch.add_column(sa.Column("subject", sa.String(length=200), nullable=True))
    op.create_index("ix_request_records_project_subject_at", "request_records", ["project_id", "subject", "at"])
    with op.batch_alter_table("budgets") as batch:
        batch.add_column(sa.Column("per_subject", sa.Boolean(), nullable=False, server_default=sa.text("false")))


def downgrade() -> None:
    with op.batch_alter_table("budgets") as batch:
        batch.drop_column("per_subject")
    op.drop_index("ix_request_records_project_subject_at", table_name="request_records")
    with op.batch_alter_table("request_records") as batch:
        batch.drop_column("subject")
    with op.batch_alter_table("projects") as batch:
        batch.drop_column("subject_rate_limit_per_minute")
        batch.drop_column("identity_provider")
        batch.drop_column("allowed_origins")
