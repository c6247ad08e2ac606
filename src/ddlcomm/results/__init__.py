"""Results: the SQLite store of runs and points, export, comparison, system facts."""
from __future__ import annotations

from .store import Store, default_db_path

__all__ = ["Store", "default_db_path"]
