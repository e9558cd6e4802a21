"""events and webhooks; key age (when a key's secret was set, a project's policy) and timed retirement; budget
alert thresholds

Revision ID: 0009
Revises: 0008
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project_id", sa.String(length=32), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret_ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("master_key_id", sa.String(length=16), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhooks_project_id", "webhooks", ["project_id"])
    op.create_index("ix_webhooks_master_key_id", "webhooks", ["master_key_id"])
    op.create_table(
        "events",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("project_id", sa.String(length=32), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("once_key", sa.String(length=200), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("once_key"),
    )
    op.create_index("ix_events_project_id_created_at", "events", ["project_id", "created_at"])
    op.create_table(
        "event_deliveries",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.String(length=32), nullable=False),
        sa.Column("webhook_id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=200), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["event_id"], ["events.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_event_deliveries_webhook_id", "event_deliveries", ["webhook_id"])
    op.create_index("ix_event_deliveries_next_attempt_at", "event_deliveries", ["next_attempt_at"])
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key_max_age_days", sa.Integer(), nullable=True))
    with op.batch_alter_table("provider_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sealed_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("retire_at", sa.DateTime(timezone=True), nullable=True))
    # Existing budgets alert at 80 % and 100 %; the default then goes (PostgreSQL cannot compare JSON).
    with op.batch_alter_table("budgets", schema=None) as batch_op:
        batch_op.add_column(sa.Column("thresholds", sa.JSON(), server_default=sa.text("'[80, 100]'"), nullable=False))
    with op.batch_alter_table("budgets", schema=None) as batch_op:
        batch_op.alter_column("thresholds", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("budgets", schema=None) as batch_op:
        batch_op.drop_column("thresholds")
    with op.batch_alter_table("provider_keys", schema=None) as batch_op:
        batch_op.drop_column("retire_at")
        batch_op.drop_column("sealed_at")
    with op.batch_alter_table("projects", schema=None) as batch_op:
        batch_op.drop_column("key_max_age_days")
    op.drop_index("ix_event_deliveries_next_attempt_at", table_name="event_deliveries")
    op.drop_index("ix_event_deliveries_webhook_id", table_name="event_deliveries")
    op.drop_table("event_deliveries")
    op.drop_index("ix_events_project_id_created_at", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_webhooks_master_key_id", table_name="webhooks")
    op.drop_index("ix_webhooks_project_id", table_name="webhooks")
    op.drop_table("webhooks")
