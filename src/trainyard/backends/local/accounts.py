"""The account files a remapped task gets as its own copies (``account_entries``), with every
password field scrubbed (``scrub_passwords``): no hash of the host's reaches a task.
"""

from __future__ import annotations

import functools
import os
import stat

from trainyard.backends.local.sandboxplan import ACCOUNTS, PWD_LOCK

__all__ = ["account_entries", "scrub_passwords"]


_FreshItem = tuple[str, bool, int, str]


@functools.lru_cache(maxsize=8)
def account_entries(host_root: str) -> tuple[_FreshItem, ...]:
    """The ``ACCOUNTS`` files of the host (below ``host_root``) as a remapped task gets them
    (``FRESH``'s shape: relative path, False, mode, text): passwd, group, subuid and subgid
    as the host has them (others may read them there), shadow and gshadow through
    ``scrub_passwords``, each with the host's mode plus the owner's read and write bits (the
    owner is the task's root, which has no ``CAP_DAC_OVERRIDE`` to get past a 0000
    ``/etc/shadow`` as on Fedora), and, if any, an empty ``PWD_LOCK``. One that is missing,
    a link, not a regular file, unreadable or not UTF-8 is left out (the task sees the
    host's, and cannot add accounts). Read once per process, like the skeleton's look: an
    account added on the host later is not in tasks that process starts.
    """
    found: list[_FreshItem] = []
    for rel, scrub in ACCOUNTS:
        read = _read_account(os.path.join(host_root, rel))
        if read is None:
            continue
        text, mode = read
        found.append((rel, False, mode | 0o600, scrub_passwords(text) if scrub else text))
    return (*found, PWD_LOCK) if found else ()


def _read_account(path: str) -> tuple[str, int] | None:
    """The text and permission bits of the regular file ``path`` (a link is not followed),
    or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        try:
            return handle.read().decode("utf-8"), stat.S_IMODE(info.st_mode)
        except (OSError, UnicodeDecodeError):
            return None


def scrub_passwords(text: str) -> str:
    """``text`` of a shadow or gshadow file (shadow(5), gshadow(5): ``name:password:...``)
    with each entry's password field replaced: ``!`` where the host's was locked (starts
    with ``!``), else ``*`` (no password matches either). The other fields are kept (ageing,
    a group's administrators and members, as ``/etc/group`` shows them); a line without a
    ``:`` (blank, a comment) is left out. No hash of the host's is in the result.
    """
    lines = []
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        if not colon:
            continue
        password, sep, tail = rest.partition(":")
        lines.append(f"{name}:{'!' if password.startswith('!') else '*'}{sep}{tail}")
    return "".join(f"{line}\n" for line in lines)
