"""Alembic environment: credgate runs migrations on a connection it passes in (see Database.upgrade)."""

from alembic import context

from credgate.storage.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
