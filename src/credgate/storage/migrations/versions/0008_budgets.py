"""budgets, price lists, and each request's model and cost

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project_id", sa.String(length=32), nullable=False),
        sa.Column("provider", sa.String(length=63), nullable=True),
        sa.Column("metric", sa.String(length=16), nullable=False),
        sa.Column("period", sa.String(length=8), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("reserve", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_budgets_project_id", "budgets", ["project_id"])
    # Existing integrations get an empty price list; the default then goes (PostgreSQL cannot compare JSON).
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prices", sa.JSON(), server_default=sa.text("'[]'"), nullable=False))
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.alter_column("prices", server_default=None)
    # Null for the requests recorded before: their cost was never known, nor whether they passed every check.
    with op.batch_alter_table("request_records", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("cost_micros", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("admitted", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("request_records", schema=None) as batch_op:
        batch_op.drop_column("admitted")
        batch_op.drop_column("cost_micros")
        batch_op.drop_column("model")
    with op.batch_alter_table("integrations", schema=None) as batch_op:
        batch_op.drop_column("prices")
    op.drop_index("ix_budgets_project_id", table_name="budgets")
    op.drop_table("budgets")
