"""The task's own Python environment: ``pip install`` works in a task and lands in its layer.

Inside the task's private root the runner makes a small virtual environment (``TASK_VENV``,
``/trainyard/venv``) whose ``site-packages`` adds trainyard's (read-only) through a ``.pth``
line; its ``bin`` comes first on PATH. ``python``/``python3``/``pythonX.Y`` are the same
interpreter with this prefix (what the task installs is imported first; what trainyard's holds
counts as installed); ``pip``, ``pipX.Y``, ``torchrun`` are trainyard's, run by it;
``trainyard``, ``osmo`` and every other program stay trainyard's. Nothing here follows a
symlink the task made (``safefs``). Details: docs/local-backend.md, "The task's Python".
"""

from __future__ import annotations

import functools
import os
import platform
import site
import sys

from trainyard.linux.safefs import link_at, open_folder_at, open_folder_inside, write_at

__all__ = ["TASK_VENV", "SHIMS", "make_task_venv", "venv_files"]

TASK_VENV = "/trainyard/venv"
"""Where the task's own environment is, as the task sees it (the runner's reserved folder)."""

SHIMS: dict[str, str] = {
    "pip": "from pip._internal.cli.main import main",
    "torchrun": "from torch.distributed.run import main",
}
"""Programs of trainyard's environment the task's runs with its own interpreter."""

_SHIM = """#!/bin/sh
'''exec' "$(dirname -- "$0")/python" "$0" "$@"
' '''
import sys
{import_line}
if __name__ == "__main__":
    sys.argv[0] = sys.argv[0].removesuffix(".exe")
    sys.exit(main())
"""
"""A script that runs with the ``python`` beside it whatever the folder's path (spaces, or
longer than a ``#!`` line may be: the form pip itself writes for such paths)."""


def _version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


@functools.lru_cache(maxsize=1)
def venv_files() -> tuple[tuple[tuple[str, str, int], ...], tuple[tuple[str, str], ...]]:
    """What the task's environment holds, the same for every task of this process:
    ``((relative path, text, mode), ...)`` and ``((relative link, target), ...)``."""
    interpreter = os.path.realpath(sys.executable)
    version = _version()
    sites = [p for p in site.getsitepackages() if os.path.isdir(p)]
    pth = "".join(f"import site; site.addsitedir({p!r})\n" for p in sites)
    files = [
        (
            "pyvenv.cfg",
            f"home = {os.path.dirname(interpreter)}\ninclude-system-site-packages"
            f" = false\nversion = {platform.python_version()}\n",
            0o644,
        ),
        (f"lib/python{version}/site-packages/_trainyard.pth", pth, 0o644),
    ]
    for name, import_line in SHIMS.items():
        text = _SHIM.format(import_line=import_line)
        names = [name, f"{name}3", f"{name}{version}"] if name == "pip" else [name]
        files += [(f"bin/{n}", text, 0o755) for n in names]
    links = [(f"bin/{n}", interpreter) for n in ("python", "python3", f"python{version}")]
    return tuple(files), tuple(links)


def make_task_venv(base: str, relative: str, owner: tuple[int, int] | None) -> None:
    """Write the task's environment at ``base/relative`` (``relative``: ``TASK_VENV`` below
    the task's root), its files and folders ``owner``'s; what an earlier attempt left there
    (RESTART) is kept, the files above rewritten.

    Raises:
        OSError: it cannot be written (``safefs.SymlinkRefused`` for a link on the way).
    """
    files, links = venv_files()
    folders: dict[str, list[tuple[str, str, int | None]]] = {}
    for rel, text, file_mode in files:
        folder, _, name = rel.rpartition("/")
        folders.setdefault(folder, []).append((name, text, file_mode))
    for rel, target in links:
        folder, _, name = rel.rpartition("/")
        folders.setdefault(folder, []).append((name, target, None))
    venv = open_folder_inside(base, relative, owner)
    try:
        for folder, entries in folders.items():  # each folder walked to once
            fd = open_folder_at(venv, folder, owner)
            try:
                for name, text, mode in entries:
                    if mode is None:
                        link_at(fd, name, text, owner)
                    else:
                        write_at(fd, name, text, mode, owner)
            finally:
                os.close(fd)
    finally:
        os.close(venv)
