"""Persistence: the ORM models, the Database (engine, transactions, migrations) and its Repository."""

from credgate.storage.database import Database, DuplicateRow, StorageUnavailable
from credgate.storage.repository import Repository, RequestRow, ResolvedRow, UsageRow

__all__ = ["Database", "DuplicateRow", "Repository", "RequestRow", "ResolvedRow", "StorageUnavailable", "UsageRow"]
