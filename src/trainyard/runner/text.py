"""Text transformations the runner applies to a task before running it.

- ``expand_vars``: Kubernetes' ``$(VAR)`` expansion of command and args from the task's
  environment (``$$`` escapes ``$``; an unknown ``$(NAME)`` stays as written). Source:
  Kubernetes API reference, Container ``command``/``args`` ("Variable references $(VAR_NAME)
  are expanded using the container's environment") and ``third_party/forked/golang/expansion``.
- ``PathRewriter``: for backends that cannot give a task its own ``/`` (no bubblewrap), maps
  absolute paths such as ``/tmp`` onto the task's private root folder.

Special tokens (``{{output}}`` ...) are resolved by ``trainyard.spec.tokens``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

__all__ = ["expand_vars", "PathRewriter"]


def _read_reference(text: str, start: int) -> tuple[str | None, str, int]:
    """Read what follows the ``$`` at ``start``: (variable name or None, literal, next index)."""
    nxt = text[start + 1] if start + 1 < len(text) else ""
    if nxt == "$":
        return None, "$", start + 2
    if nxt == "(":
        close = text.find(")", start + 2)
        if close != -1:
            return text[start + 2 : close], text[start : close + 1], close + 1
        return None, "$(", start + 2
    return None, "$", start + 1


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` references in ``text`` the way Kubernetes expands container args.

    Args:
        text: one command or argument string.
        env: the variables that can be referenced.

    Returns:
        ``text`` with each ``$(NAME)`` whose NAME is in ``env`` replaced by its value,
        ``$$`` replaced by ``$`` (so ``$$(VAR)`` gives a literal ``$(VAR)``), everything else
        unchanged (``$(unknown)``, ``$((1+2))``, ``$HOME``).
    """
    if "$" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        if text[index] != "$":
            out.append(text[index])
            index += 1
            continue
        name, literal, index = _read_reference(text, index)
        out.append(env[name] if name is not None and name in env else literal)
    return "".join(out)


class PathRewriter:
    """Maps absolute paths below some top folders onto a private root folder.

    ``PathRewriter("/r", ["/tmp"]).rewrite("sh /tmp/run.sh")`` gives ``"sh /r/tmp/run.sh"``.
    A prefix matches only as a whole path component at the start of a path (``/tmpx`` and
    ``a/tmp`` are left alone).
    """

    def __init__(self, root: str, prefixes: Iterable[str]) -> None:
        self.root = root.rstrip("/")
        unique = sorted({p.rstrip("/") for p in prefixes if p.startswith("/") and p != "/"})
        self.prefixes = unique
        alternatives = "|".join(re.escape(p) for p in sorted(unique, key=len, reverse=True))
        self._pattern = (
            re.compile(rf"(?<![\w./~-])(?:{alternatives})(?![\w.-])") if unique else None
        )

    def rewrite(self, text: str) -> str:
        """``text`` with every matching absolute path moved under the root."""
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self.root + m.group(0), text)

    def place(self, path: str) -> str:
        """Where a file with ``path`` (absolute, or relative to ``/``) lives on the host."""
        relative = PurePosixPath("/", path).relative_to("/")
        return f"{self.root}/{relative}"
