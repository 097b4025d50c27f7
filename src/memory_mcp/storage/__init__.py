"""Storage: the store seam (``base``) and the factory that opens a backend (``factory``)."""

from memory_mcp.storage.base import Filters, Scored, Store, StoreStats, WriteTransaction
from memory_mcp.storage.factory import open_store

__all__ = ["Filters", "Scored", "Store", "StoreStats", "WriteTransaction", "open_store"]
