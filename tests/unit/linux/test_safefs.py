"""``linux.safefs.write_inside``: files land below the task's folder, through no symlink."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard.linux.safefs import SymlinkRefused, write_inside


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


def test_files_inside_keeps_inner_links_and_skips_links_out(tmp_path: Path) -> None:
    from trainyard.linux.safefs import files_inside

    out, host = tmp_path / "out", tmp_path / "host"
    out.mkdir()
    host.mkdir()
    (host / "secret").write_text("s\n")
    (out / "a.txt").write_text("a\n")
    (out / "inner").symlink_to("a.txt")
    (out / "leak").symlink_to(host / "secret")
    (out / "dir-leak").symlink_to(host)
    (out / "dangling").symlink_to("nowhere")
    os.mkfifo(out / "fifo")
    lines: list[str] = []
    found = files_inside(out, lines.append)
    assert [rel for _p, rel in found] == ["a.txt", "inner"]
    assert all(p == out / "a.txt" for p, _rel in found)
    assert sorted(line.split(":")[0] for line in lines) == ["dangling", "dir-leak", "leak"]


def test_open_no_links_refuses_a_component_swapped_for_a_link(tmp_path: Path) -> None:
    from trainyard.linux.safefs import open_no_links

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("ok\n")
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "f").write_text("secret\n")
    fd = open_no_links(tmp_path / "d" / "f")
    assert os.read(fd, 10) == b"ok\n"
    os.close(fd)
    (tmp_path / "d" / "f").rename(tmp_path / "g")
    (tmp_path / "d").rmdir()
    (tmp_path / "d").symlink_to(tmp_path / "host")  # the folder becomes a link after listing
    with pytest.raises(SymlinkRefused):
        open_no_links(tmp_path / "d" / "f")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(SymlinkRefused):
        open_no_links(tmp_path / "fifo")
