"""Issue 11: a manifest records the size of the bytes copied, beside their digest.

An upload lists its files (with their sizes) before it copies them. A file that changes in
between (a log that grows, a checkpoint rewritten) must be recorded with the size AND the
digest of the bytes that were copied, never the listing's size beside the new bytes' digest.
Failing the file instead would fail every checkpoint round of a growing log, so the copy is
recorded as it was made. Both ways are checked: the local copy (``file://``, hashed while
copied) and the fsspec path (``memory://``: hashed, then sent).
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import blake3
import pytest
from data_unit_support import write_tree

from trainyard.data import DatasetStore, Mover, checkpoints
from trainyard.data.checkpoints import CheckpointWriter
from trainyard.data.transfer import LocalFile, plan_uploads

NEW = b"grown since the listing: " + b"x" * 5000


def _hex(entry_digest: str, data: bytes) -> tuple[str, str]:
    algo, _, value = entry_digest.rpartition(":")
    want = blake3.blake3(data) if algo == "blake3" else hashlib.sha256(data)
    return value, want.hexdigest()


def _store_urls(tmp_path: Path) -> list[str]:
    return [(tmp_path / "store").as_uri(), f"memory://sizes-{uuid.uuid4().hex}"]


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_dataset_file_grown_after_the_listing_is_recorded_as_copied(
    tmp_path: Path, where: str
) -> None:
    root = write_tree(tmp_path / "src", {"log.txt": "old", "same.txt": "same"})
    files = plan_uploads([f"{root}/"], None)
    assert [f.size for f in files] == [3, 4]
    (root / "log.txt").write_bytes(NEW)  # after the listing, before the copy
    url = _store_urls(tmp_path)[0 if where == "file" else 1]
    version = DatasetStore(url, Mover()).upload("ds", files)
    entries = {f.path: f for f in version.files}
    assert entries["log.txt"].size == len(NEW)
    got, want = _hex(entries["log.txt"].digest, NEW)
    assert got == want
    assert entries["same.txt"].size == 4
    _, stats = DatasetStore(url, Mover()).download("ds", tmp_path / "back")
    assert (tmp_path / "back" / "log.txt").read_bytes() == NEW
    assert stats.bytes == len(NEW) + 4


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_checkpoint_file_grown_after_the_listing_is_recorded_as_copied(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tree(tmp_path / "ckpt", {"train.log": "step 1\n"})
    real = checkpoints.local_files

    def listed_then_grown(*args: object, **kwargs: object) -> list[LocalFile]:
        found = real(*args, **kwargs)  # type: ignore[arg-type]
        (src / "train.log").write_bytes(NEW)
        return found

    monkeypatch.setattr(checkpoints, "local_files", listed_then_grown)
    url = _store_urls(tmp_path)[0 if where == "file" else 1]
    writer = CheckpointWriter(url, Mover())
    assert writer.upload_round(src, None, {}) == 1
    (entry,) = writer.entries.values()
    assert entry.size == len(NEW)
    got, want = _hex(entry.sha256, NEW)
    assert got == want
