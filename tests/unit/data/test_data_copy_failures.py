"""Dataset copies on ``file://`` where they fail (issue 11's cases, kept when the copy helper
process went): a file that vanishes, a symlink planted at a target, in the store or in an
upload's source. Real files; each copy hashed while copied (``localcopy``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainyard.data import DatasetStore, storage
from trainyard.data.transfer import plan_uploads
from trainyard.errors import DataError


def _tree(root: Path, count: int, size: int = 3000) -> dict[str, bytes]:
    tree = {f"d{i % 3}/f{i:03}.bin": os.urandom(size + i) for i in range(count)}
    for rel, data in tree.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return tree


def _read(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _partials(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if storage.PARTIAL_MARK in p.name]


def _stored(home: Path, name: str, rel: str) -> Path:
    return next((home / "datasets" / name / "data").glob(f"*/{rel}"))


def test_a_file_that_vanishes_fails_as_it_does_in_this_process(tmp_path: Path, home: Path) -> None:
    _tree(tmp_path / "src", 12)
    files = plan_uploads([f"{tmp_path / 'src'}/"], None)
    (tmp_path / "src" / "d1" / "f004.bin").unlink()  # after the listing
    store = DatasetStore()
    with pytest.raises(DataError, match=r"d1/f004\.bin .*FileNotFoundError"):
        store.upload("ds", files)
    assert store.versions("ds") == []
    assert not list((home / "datasets" / "ds" / "data").iterdir())


def test_a_stored_file_that_vanishes_fails_the_download_and_leaves_no_partial(
    tmp_path: Path, home: Path
) -> None:
    _tree(tmp_path / "src", 12)
    store = DatasetStore()
    store.upload("ds", plan_uploads([f"{tmp_path / 'src'}/"], None))
    _stored(home, "ds", "d2/f005.bin").unlink()
    with pytest.raises(DataError, match=r"d2/f005\.bin .*FileNotFoundError"):
        store.download("ds", tmp_path / "back")
    assert not (tmp_path / "back" / "d2" / "f005.bin").exists()
    assert not _partials(tmp_path / "back")


def test_a_symlink_planted_at_a_download_target_is_replaced_not_followed(
    tmp_path: Path,
) -> None:
    tree = _tree(tmp_path / "src", 12)
    store = DatasetStore()
    store.upload("ds", plan_uploads([f"{tmp_path / 'src'}/"], None))
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    target = tmp_path / "back" / "d0" / "f003.bin"
    target.parent.mkdir(parents=True)
    target.symlink_to(victim)
    store.download("ds", tmp_path / "back")
    assert victim.read_text() == "keep me"
    assert not target.is_symlink() and _read(tmp_path / "back") == tree


def test_a_symlink_planted_in_the_store_fails_the_digest_and_writes_nothing(
    tmp_path: Path, home: Path
) -> None:
    _tree(tmp_path / "src", 12)
    store = DatasetStore()
    store.upload("ds", plan_uploads([f"{tmp_path / 'src'}/"], None))
    stored = _stored(home, "ds", "d1/f007.bin")
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 100)
    stored.unlink()
    stored.symlink_to(secret)
    with pytest.raises(DataError, match=r"d1/f007\.bin .*(blake3|sha256)"):
        store.download("ds", tmp_path / "back")
    assert not (tmp_path / "back" / "d1" / "f007.bin").exists()
    assert not _partials(tmp_path / "back")
    assert secret.read_bytes() == b"s" * 100


def test_a_symlink_planted_in_an_upload_source_is_copied_as_this_process_copies_it(
    tmp_path: Path,
) -> None:
    """A user's own ``dataset upload`` follows links (``cp -rL``); the manifest records the
    bytes copied, with their size."""
    _tree(tmp_path / "src", 12)
    files = plan_uploads([f"{tmp_path / 'src'}/"], None)
    other = tmp_path / "other"
    other.write_bytes(b"o" * 7)
    (tmp_path / "src" / "d0" / "f000.bin").unlink()
    (tmp_path / "src" / "d0" / "f000.bin").symlink_to(other)
    version = DatasetStore().upload("ds", files)
    assert {f.path: f.size for f in version.files}["d0/f000.bin"] == 7
