"""What the rsync tests read from rsync and do to their files (tests only)."""

from __future__ import annotations

import os
import re
from pathlib import Path


def literal_bytes(stats: str) -> int:
    """The bytes rsync sent as data, not matched blocks (``--stats``' "Literal data")."""
    found = re.search(r"Literal data: ([\d,.]+) bytes", stats)
    assert found, stats
    return int(found.group(1).replace(",", "").replace(".", ""))


def later_mtime(path: Path) -> None:
    """Move ``path``'s mtime 10 s on: a rewrite of the same size within the second of the
    first upload looks unchanged to rsync's quick check (size and mtime), which skips it."""
    stat = path.stat()
    os.utime(path, (stat.st_atime, stat.st_mtime + 10))
