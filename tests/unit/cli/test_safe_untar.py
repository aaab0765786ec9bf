"""``cli.safe_untar``: what a task sends through ``workflow rsync download`` is unpacked
following no link, and refused when any member would land or point outside the folder.

Each archive below is an attack a task can send (it controls the ``tar`` in its own root).
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import Path

import pytest
from tar_attacks import archive as _archive
from tar_attacks import cve_2025_4517 as _cve_2025_4517
from tar_attacks import file as _file
from tar_attacks import folder as _dir
from tar_attacks import link as _link

from trainyard.cli.safe_untar import UnsafeArchive, extract, place


def test_the_cve_poc_writes_outside_with_this_pythons_data_filter(tmp_path: Path) -> None:
    """The attack is real here: tarfile's own ``data`` filter lets it write outside."""
    outside, dest = tmp_path / "outside", tmp_path / "x" / "dest"
    outside.mkdir()
    dest.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=_cve_2025_4517(outside, dest), mode="r|") as archive:
            archive.extractall(dest, filter="data")
    except (tarfile.FilterError, OSError):
        pytest.skip("this Python's tarfile refuses CVE-2025-4517 (patched: 3.9.23/3.12.11+)")
    assert (outside / "pwned").exists()


def test_the_cve_poc_is_refused_and_writes_nothing_outside(tmp_path: Path) -> None:
    outside, dest = tmp_path / "outside", tmp_path / "x" / "dest"
    outside.mkdir()
    dest.mkdir(parents=True)
    with pytest.raises(UnsafeArchive):
        extract(_cve_2025_4517(outside, dest), dest)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ([_file("/etc/evil")], "absolute"),
        ([_file("../evil")], "'..'"),
        ([_file("a/../../evil")], "'..'"),
        ([_link("l", "/etc")], "absolute"),
        ([_link("l", "../outside")], "outside"),
        ([_dir("s"), _link("s/l", "../../outside")], "outside"),
        ([_link("s", "."), _link("l", "s/..")], "outside"),  # lexically inside, really not
        ([_link("l", "s/.."), _link("s", ".")], "outside"),  # the same, the link made first
        (
            [
                _link("s", "."),
                _link(
                    "t",
                    "s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/s/"
                    "s/s/s/s/s/s/s/s/s/s/s/s/s/s",
                ),
            ],
            "more than 40",
        ),
        ([_link("h", "/etc/passwd", tarfile.LNKTYPE)], "absolute"),
        ([_link("h", "missing", tarfile.LNKTYPE)], "hard link"),
        ([_dir("d"), _link("h", "d", tarfile.LNKTYPE)], "hard link"),
        ([_dir("sub"), _link("l", "sub"), _file("l/through")], "symlink"),
        ([_link("l", "elsewhere"), _file("l/through")], "symlink"),
        ([_dir("d"), _file("d")], "folder"),
    ],
)
def test_refused_members(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], words: str
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(UnsafeArchive, match=words.replace("(", r"\(")):
        extract(_archive(*members), dest)
    assert not (tmp_path / "outside").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_devices_and_fifos_are_refused(tmp_path: Path, kind: bytes) -> None:
    info = tarfile.TarInfo("dev")
    info.type = kind
    info.devmajor, info.devminor = 1, 3
    with pytest.raises(UnsafeArchive, match="special file"):
        extract(_archive((info, None)), tmp_path)
    assert not (tmp_path / "dev").exists()


def test_a_tree_unpacks_with_its_links_inside_and_safe_modes(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    count = extract(
        _archive(
            _dir("./"),
            _dir("./sub"),
            _file("./sub/run.sh", b"#!/bin/sh\n", 0o4777),
            _file("./top.txt", b"one\n"),
            _file("./top.txt", b"two\n"),  # a later one replaces
            _link("./latest", "sub/run.sh"),
            _link("./sub/up", "../top.txt"),
            _link("./hard", "sub/run.sh", tarfile.LNKTYPE),
            _link("./dangling", "nowhere/x"),
        ),
        dest,
    )
    assert count == 8
    assert (dest / "top.txt").read_text() == "two\n"
    assert (dest / "latest").read_text() == "#!/bin/sh\n"
    assert (dest / "sub" / "up").read_text() == "two\n"
    assert os.readlink(dest / "dangling") == "nowhere/x"
    mode = stat.S_IMODE((dest / "sub" / "run.sh").stat().st_mode)
    assert mode == 0o755  # setuid and group/other write dropped
    assert (dest / "hard").stat().st_ino == (dest / "sub" / "run.sh").stat().st_ino


def test_placing_into_a_folder_never_follows_a_link_already_there(tmp_path: Path) -> None:
    """A first download plants ``evil -> outside``; a second one sends ``evil/x``."""
    outside, local, staging = tmp_path / "outside", tmp_path / "local", tmp_path / "staging"
    outside.mkdir()
    local.mkdir()
    (local / "evil").symlink_to(outside)
    staging.mkdir()
    extract(_archive(_dir("evil"), _file("evil/x"), _file("plain")), staging)
    with pytest.raises(UnsafeArchive, match="symlink or file"):
        place(staging, local)
    assert list(outside.iterdir()) == []


def test_placing_merges_folders_and_replaces_files_and_links(tmp_path: Path) -> None:
    local, staging = tmp_path / "local", tmp_path / "staging"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "keep.txt").write_text("kept\n")
    (local / "sub" / "new.txt").symlink_to(tmp_path / "target")
    staging.mkdir()
    extract(_archive(_dir("sub"), _file("sub/new.txt", b"new\n")), staging)
    place(staging, local)
    assert (local / "sub" / "keep.txt").read_text() == "kept\n"
    assert not (local / "sub" / "new.txt").is_symlink()
    assert (local / "sub" / "new.txt").read_text() == "new\n"
    assert not (tmp_path / "target").exists()
