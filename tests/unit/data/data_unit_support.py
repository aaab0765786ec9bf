"""Helpers for the data layer's unit tests: small file trees."""

from __future__ import annotations

from pathlib import Path


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``root``; returns ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(parents=True, exist_ok=True)
    return root


def read_tree(root: Path) -> dict[str, str]:
    """Relative path -> text of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
