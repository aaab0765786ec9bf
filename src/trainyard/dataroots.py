"""Which host folders ``file://`` URLs of a workflow may read and write.

A ``file://`` URL (or a plain path) of a task's inputs, outputs and checkpoints must be one of
the pool's data roots or below it, after symlinks are resolved (``os.path.realpath``), and
never inside ``$TRAINYARD_HOME`` unless a root inside the home contains it. The roots: the pool
option ``allowed_data_roots`` (``[]`` turns ``file://`` off), by default
``$TRAINYARD_HOME/storage/<user>`` (the home's owner has all of ``storage``); the system temp
folder is not a default. Other schemes pass. Checked at submit and ``workflow validate``
(``spec.poolfit.check_data_urls``) and by the runner before it moves a byte
(``TaskRun.data_roots``). Why: docs/security.md, "`file://` URLs".
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["OPTION", "data_roots", "home_owner", "host_path", "url_problem"]

OPTION = "allowed_data_roots"


def data_roots(options: Mapping[str, Any], home: Path, user: str | None = None) -> list[str]:
    """The data roots of ``user`` on a pool.

    Args:
        options: the pool's options; ``options[OPTION]`` is a path or a list of paths.
        home: ``$TRAINYARD_HOME``.
        user: who submitted the workflow; None: the home's owner.

    Returns:
        The listed roots; else ``[home/storage/<user>]``, or ``[home/storage]`` for the
        home's owner (never the temp folder; ``[]`` for a user name that is no folder name).
    """
    if OPTION in options:
        value = options.get(OPTION) or []
        return [str(p) for p in ([value] if isinstance(value, str) else value)]
    storage = home / "storage"
    if user is None or user == home_owner(home):
        return [str(storage)]
    if not user or user in (".", "..") or "/" in user or "\0" in user:
        return []
    return [str(storage / user)]


def home_owner(home: Path) -> str | None:
    """The name of the user owning ``home`` (who runs the server), or None."""
    try:
        return pwd.getpwuid(os.stat(home).st_uid).pw_name
    except (OSError, KeyError):
        return None


def host_path(url: str) -> str | None:
    """The host path a ``file://`` URL or a plain path names; None for other schemes."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return unquote(parts.path)
    if parts.scheme and len(parts.scheme) > 1:  # s3, gs, az, http...; "c:" is no scheme here
        return None
    return url


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def url_problem(url: str, roots: list[str], home: Path, user: str | None = None) -> str | None:
    """Why ``url`` may not be used (a one-line message), or None when it may.

    Args:
        url: the URL as the task will use it.
        roots: the data roots of the submitter on the pool (``data_roots``).
        home: ``$TRAINYARD_HOME``.
        user: the submitter, named in the message when given.
    """
    raw = host_path(url)
    if raw is None:
        return None
    path = os.path.realpath(raw)
    real_home = os.path.realpath(home)
    for root in (os.path.realpath(r) for r in roots):
        if _under(path, root) and (not _under(path, real_home) or _under(root, real_home)):
            return None
    shown = ", ".join(roots) or "none: file:// is off"
    whose = f" for user {user!r}" if user else ""
    return (
        f"{url!r} is a host path ({path}) outside the pool's data roots{whose} ({shown}); use a "
        f"folder below one of them, or ask an administrator to add one to options.{OPTION} "
        "of the pool in pools.yaml"
    )
