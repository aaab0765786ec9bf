"""``runner.safefs.write_inside``: files land below the task's folder, through no symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard.runner.safefs import SymlinkRefused, write_inside


def test_writes_making_folders_with_mode(tmp_path: Path) -> None:
    write_inside(str(tmp_path), "a b/c/file.sh", "echo hi\n")
    target = tmp_path / "a b" / "c" / "file.sh"
    assert target.read_text() == "echo hi\n"
    assert target.stat().st_mode & 0o777 == 0o755
    write_inside(str(tmp_path), "/a b/c/file.sh", "again\n")  # leading / and overwrite
    assert target.read_text() == "again\n"


@pytest.mark.parametrize("link_at", ["app", "app/deeper", "app/deeper/x"])
def test_a_symlink_anywhere_below_the_folder_is_refused(tmp_path: Path, link_at: str) -> None:
    root, host = tmp_path / "root", tmp_path / "host"
    host.mkdir()
    link = root / link_at
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(host if link_at != "app/deeper/x" else host / "x", link)
    with pytest.raises(SymlinkRefused, match="symlink"):
        write_inside(str(root), "app/deeper/x", "pwned")
    assert list(host.iterdir()) == []


def test_dot_dot_and_empty_paths_are_refused(tmp_path: Path) -> None:
    for bad in ("../x", "a/../../x", "", "/"):
        with pytest.raises(OSError):
            write_inside(str(tmp_path / "root"), bad, "x")
    assert not (tmp_path / "x").exists()
