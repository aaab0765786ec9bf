"""store layer: persistence of workflows and apps (SQLAlchemy). See store/db.py."""

from __future__ import annotations

from trainyard.store.db import AppRecord, Store, WorkflowRecord, default_url

__all__ = ["Store", "WorkflowRecord", "AppRecord", "default_url"]
