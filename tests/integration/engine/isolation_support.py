"""The engine on a local pool with the real bubblewrap sandbox, for the isolation tests
(``test_sandbox_*``): the shared ``tests/support/engine_run.py``, under the name these tests
import."""

from __future__ import annotations

from engine_run import TIMEOUT_S, EngineRun, require_bwrap

__all__ = ["TIMEOUT_S", "EngineRun", "require_bwrap"]
