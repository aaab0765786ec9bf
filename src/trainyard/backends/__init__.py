"""backends layer: one module per backend behind ``base.Backend`` (see ../shared/DESIGN.md).

``get_backend(pool, home)`` builds the backend a pool names. The registry maps a backend name to
``module:factory`` and imports the module only when a pool uses it, so optional libraries
(kubernetes, ...) are needed only there. A factory takes ``(pool, home)``.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, cast

from trainyard.errors import ConfigError

if TYPE_CHECKING:  # kept out of the import path of helper processes (netns keeper, runner)
    from trainyard.backends.base import Backend
    from trainyard.pools import Pool

__all__ = [
    "BACKENDS",
    "get_backend",
    "register_backend",
    "unavailable_reason",
    "available_backends",
]

BACKENDS: dict[str, str] = {
    "local": "trainyard.backends.local:create",
    "slurm": "trainyard.backends.slurm:create",
    "kubernetes": "trainyard.backends.kubernetes:create",
    "fake": "trainyard.backends:_fake",
}
"""Backend name -> ``module:factory``; the factory is called as ``factory(pool, home)``."""


def register_backend(name: str, target: str) -> None:
    """Add or replace a backend (``target``: ``"package.module:factory"``)."""
    BACKENDS[name] = target


def unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot be used here (unknown, or its module is not installed),
    or None when its module is found. Imports nothing (``importlib.util.find_spec``)."""
    target = BACKENDS.get(name)
    if target is None:
        return f"unknown backend {name!r}"
    module_name = target.partition(":")[0]
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        return f"its module {module_name} cannot be loaded: {exc}"
    return None if found is not None else f"its module {module_name} is not installed"


def available_backends() -> list[str]:
    """Names of the registered backends whose module is installed, sorted."""
    return sorted(name for name in BACKENDS if unavailable_reason(name) is None)


def get_backend(pool: Pool, home: Path) -> Backend:
    """The backend ``pool.backend`` names, for ``pool`` with state under ``home``.

    Raises:
        ConfigError: unknown backend (the message lists the known ones), or its module or
            an optional library it needs is missing.
    """
    target = BACKENDS.get(pool.backend)
    if target is None:
        raise ConfigError(
            f"pool {pool.name!r}: unknown backend {pool.backend!r}; "
            f"backends: {', '.join(sorted(BACKENDS))}"
        )
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"pool {pool.name!r}: backend {pool.backend!r} is not available: {exc}"
        ) from exc
    return cast("Backend", factory(pool, home))


def _fake(pool: Pool, home: Path) -> Backend:
    """Registry entry for the scripted fake backend (every task exits 0)."""
    from trainyard.backends.fake import FakeBackend

    return FakeBackend()
