"""Fixtures for runner tests (helpers live in runner_support.py)."""

from __future__ import annotations

from runner_support import make_run

__all__ = ["make_run"]
