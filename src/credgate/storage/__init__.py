"""Persistence: the ORM models, the Database (engine, transactions, migrations) and its Repository."""

from credgate.storage.database import Database, StorageUnavailable
from credgate.storage.repository import Repository, ResolvedRow

__all__ = ["Database", "Repository", "ResolvedRow", "StorageUnavailable"]
