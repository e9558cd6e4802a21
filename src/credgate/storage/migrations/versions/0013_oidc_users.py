"""oidc users: the identity provider's subject an admin user signs in as (issuer and `sub`), unique; a user who
signs in only through the identity provider has no password (an empty hash)

Revision ID: 0013
Revises: 0012
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("admin_users") as batch:
        batch.add_column(sa.Column("oidc_subject", sa.String(length=512), nullable=True))
        batch.create_unique_constraint("uq_admin_users_oidc_subject", ["oidc_subject"])


def downgrade() -> None:
    with op.batch_alter_table("admin_users") as batch:
        batch.drop_constraint("uq_admin_users_oidc_subject", type_="unique")
        batch.drop_column("oidc_subject")
