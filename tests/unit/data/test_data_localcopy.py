"""Hashed local copies (issue 11, ``data.localcopy``): the digest is of the bytes written on
both ways of copying (buffered, and kernel copy + hash of the written chunk), the kernel copy
falls back where refused, a source that changes while copied fails the file and leaves
nothing, dataset uploads write in place while downloads stay atomic, a failure stops the
workers, and the scandir listing finds what rglob did. Sizes are shrunk by monkeypatching the
thresholds, so the chunked way runs on small files; the files, threads and syscalls are real."""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
import time
from pathlib import Path

import blake3
import pytest
from data_unit_support import write_tree

from trainyard.data import DatasetStore, Mover, localcopy, storage
from trainyard.data.transfer import SMALL_FILE_BYTES, FileJob, plan_uploads
from trainyard.errors import DataError

CHUNK = 4 * mmap.ALLOCATIONGRANULARITY


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunked copies from 2 chunks up, buffered ones through a 3 KiB buffer."""
    monkeypatch.setattr(localcopy, "PIPELINE_CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(localcopy, "PIPELINE_MIN_BYTES", 2 * CHUNK)
    monkeypatch.setattr(localcopy, "BUFFER_BYTES", 3 * 1024)


def _want(algo: str, data: bytes) -> str:
    return (blake3.blake3(data) if algo == "blake3" else hashlib.sha256(data)).hexdigest()


SIZES = [0, 1, 3 * 1024, 3 * 1024 + 1, 2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 1, 5 * CHUNK + 7]


@pytest.mark.parametrize("algo", ["blake3", "sha256"])
@pytest.mark.parametrize("atomic", [True, False])
def test_digest_is_of_the_bytes_written_on_both_ways(
    tmp_path: Path, small_thresholds: None, algo: str, atomic: bool
) -> None:
    for size in SIZES:
        source = tmp_path / f"src-{size}"
        source.write_bytes(os.urandom(size))
        target = tmp_path / "out" / "sub folder" / f"copy-{size}"
        progress: list[int] = []
        got = storage.copy_hashing(source, target, None, algo, atomic=atomic).digest
        written = target.read_bytes()
        assert written == source.read_bytes() and got == _want(algo, written), size
        localcopy.copy_file(str(source), str(target) + ".again", hashlib.sha256(), progress.append)
        assert sum(progress) == size
    assert not [p for p in (tmp_path / "out").rglob("*") if storage.PARTIAL_MARK in p.name]


def test_kernel_copy_refused_falls_back_to_the_buffered_copy(
    tmp_path: Path, small_thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused: list[int] = []

    def no_kernel_copy(*args: object) -> int:
        refused.append(1)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", no_kernel_copy)
    source = tmp_path / "big"
    source.write_bytes(os.urandom(5 * CHUNK + 7))
    got = storage.copy_hashing(source, tmp_path / "copy", None, "blake3").digest
    assert refused == [1]
    assert (tmp_path / "copy").read_bytes() == source.read_bytes()
    assert got == _want("blake3", source.read_bytes())


def test_kernel_copy_failing_midway_fails_the_copy_and_leaves_nothing(
    tmp_path: Path, small_thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.copy_file_range

    def failing_later(fd_in: int, fd_out: int, count: int, offset_src: int, offset_dst: int) -> int:
        if offset_src >= 2 * CHUNK:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd_in, fd_out, count, offset_src, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", failing_later)
    source = tmp_path / "big"
    source.write_bytes(os.urandom(5 * CHUNK))
    with pytest.raises(OSError, match="Input/output error"):
        storage.copy_hashing(source, tmp_path / "out" / "copy", None, "blake3")
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("size", [8 * 1024, 5 * CHUNK])
def test_a_source_that_changes_while_copied_fails_and_leaves_nothing(
    tmp_path: Path, small_thresholds: None, size: int
) -> None:
    source = tmp_path / "src"
    source.write_bytes(os.urandom(size))

    def grow(_count: int) -> None:
        with open(source, "ab") as handle:
            handle.write(b"more")

    for atomic in (True, False):
        with pytest.raises(localcopy.SourceChanged, match="changed while it was copied"):
            storage.copy_hashing(
                source, tmp_path / "out" / "copy", storage_callback(grow), "blake3", atomic=atomic
            )
        assert list((tmp_path / "out").iterdir()) == []


def storage_callback(call: object) -> object:
    """An fsspec-style callback whose ``relative_update`` is ``call``."""

    class Callback:
        relative_update = staticmethod(call)  # type: ignore[arg-type]

    return Callback()


def test_an_upload_of_a_changing_file_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: None
) -> None:
    src = write_tree(tmp_path / "src", {"a.txt": "a" * 10_000})
    real = localcopy._copy

    def appending(*args: object) -> int:
        copied = real(*args)  # type: ignore[arg-type]
        with open(src / "a.txt", "ab") as handle:
            handle.write(b"late")
        return copied

    monkeypatch.setattr(localcopy, "_copy", appending)
    with pytest.raises(DataError, match=r"a\.txt.*SourceChanged.*changed while it was copied"):
        DatasetStore().upload("ds", plan_uploads([f"{src}/"], None))
    assert DatasetStore().versions("ds") == []


def test_dataset_upload_writes_in_place_and_download_stays_atomic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tree(tmp_path / "src", {f"d/f{i}.txt": str(i) * (i + 1) for i in range(6)})
    real, temps = localcopy.copy_file, []

    def spy(
        source: str, target: str, hasher: object, progress: object = None, temp: str | None = None
    ) -> int:
        temps.append(temp)
        return real(source, target, hasher, progress, temp)  # type: ignore[arg-type]

    monkeypatch.setattr(localcopy, "copy_file", spy)
    store = DatasetStore()
    store.upload("ds", plan_uploads([f"{src}/"], None))
    assert temps == [None] * 6  # no reader looks at data/<upload-id>/ before the manifest
    temps.clear()
    store.download("ds", tmp_path / "back")
    assert len(temps) == 6 and all(t and storage.PARTIAL_MARK in t for t in temps)
    assert (tmp_path / "back" / "d" / "f5.txt").read_text() == "555555"


def test_a_failed_job_stops_the_workers_and_names_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_DATA_WORKERS", "2")
    started: list[str] = []
    lock = threading.Lock()

    def action(job: FileJob, _callback: object) -> str | None:
        with lock:
            started.append(job.rel)
        if job.rel == "f003":
            raise PermissionError("disk says no")
        time.sleep(0.01)  # the other worker would need 2 s to take every job left
        return None

    jobs = [FileJob(f"f{i:03}", f"/src/f{i:03}", f"/dst/f{i:03}", 1) for i in range(200)]
    with pytest.raises(DataError, match=r"f003.*PermissionError: disk says no"):
        Mover().run(jobs, action, "upload")
    assert "f003" in started and len(started) < len(jobs) // 2


def test_listing_finds_what_rglob_found(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "data", {"a.txt": "a", "sub/b.txt": "bb", "sub/deep/c.txt": "ccc"})
    outside = write_tree(tmp_path / "outside", {"x.txt": "xxxx"})
    (root / "link-to-file").symlink_to(outside / "x.txt")
    (root / "link-to-folder").symlink_to(outside)
    (root / "dangling").symlink_to(tmp_path / "absent")
    found = {f.rel: f.size for f in plan_uploads([f"{root}/"], None)}
    assert found == {"a.txt": 1, "sub/b.txt": 2, "sub/deep/c.txt": 3, "link-to-file": 4}
    assert all(f.path.is_absolute() for f in plan_uploads([f"{root}/"], None))


def test_local_small_files_run_in_one_thread_larger_ones_one_per_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    mover = Mover()
    local, remote = mover.location(tmp_path.as_uri()), mover.location("memory://bucket/x")

    def jobs(size: int) -> list[FileJob]:
        return [FileJob(f"f{i}", "s", "t", size) for i in range(10)]

    assert mover._workers(local, jobs(16 * 1024)) == 1  # per-file work holds the GIL
    assert mover._workers(local, jobs(SMALL_FILE_BYTES)) == 2  # copying and hashing do not
    assert mover._workers(remote, jobs(16 * 1024)) == 8  # latency-bound: DataConfig.workers
