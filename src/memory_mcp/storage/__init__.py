"""Storage: the store seam and its SQLite implementation."""

from memory_mcp.storage.base import Filters, Scored, Store, StoreStats, WriteTransaction
from memory_mcp.storage.sqlite import SqliteStore

__all__ = ["Filters", "Scored", "SqliteStore", "Store", "StoreStats", "WriteTransaction"]
