"""URL transfers on file://: naming, regex, atomic files, failures that name the file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from data_unit_support import read_tree, write_tree

from trainyard.data import Mover, download, list_url, storage, upload
from trainyard.data.transfer import plan_uploads
from trainyard.errors import DataError


class RecordingProgress:
    """Counts what a transfer reports (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.total = self.advanced = self.files = self.finished = 0

    def start(self, label: str, files: int, total_bytes: int) -> None:
        self.total = total_bytes

    def advance(self, nbytes: int) -> None:
        with self.lock:
            self.advanced += nbytes

    def file_done(self, rel: str) -> None:
        with self.lock:
            self.files += 1

    def finish(self) -> None:
        self.finished += 1


def test_plan_uploads_names_like_rsync(tmp_path: Path) -> None:
    write_tree(tmp_path / "data", {"a.txt": "a", "sub/b.txt": "b", "c.bin": "c"})
    write_tree(tmp_path, {"one.txt": "1"})
    kept = [f.rel for f in plan_uploads([tmp_path / "data", tmp_path / "one.txt"], r"\.txt$")]
    assert kept == ["data/a.txt", "data/sub/b.txt", "one.txt"]
    assert [f.rel for f in plan_uploads([f"{tmp_path / 'data'}/"], r"^sub/")] == ["sub/b.txt"]


def test_plan_uploads_refuses_two_files_with_one_name(tmp_path: Path) -> None:
    write_tree(tmp_path / "x", {"a.txt": "1"})
    write_tree(tmp_path / "y", {"a.txt": "2"})
    with pytest.raises(DataError, match="a.txt"):
        plan_uploads([f"{tmp_path / 'x'}/", f"{tmp_path / 'y'}/"], None)


def test_missing_path_and_bad_regex_are_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        plan_uploads([tmp_path / "absent"], None)
    with pytest.raises(DataError, match="bad regex"):
        plan_uploads([tmp_path], "(")


def test_upload_download_round_trip_with_regex_and_throughput_line(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"a.txt": "a", "b.json": "b", "deep/c.txt": "c" * 5000})
    lines: list[str] = []
    progress = RecordingProgress()
    mover = Mover(log=lines.append, progress=progress)
    url = (tmp_path / "remote").as_uri()
    stats = upload(url, [f"{tmp_path / 'src'}/"], r"\.txt$", mover)
    assert (stats.files, stats.bytes) == (2, 5001)
    assert (progress.advanced, progress.files, progress.total, progress.finished) == (
        5001,
        2,
        5001,
        1,
    )
    assert lines[-1].startswith("uploaded 2 file(s), 4.9 KiB in ") and "/s) to file://" in lines[-1]
    assert [f.rel for f in list_url(url)] == ["a.txt", "deep/c.txt"]
    assert download(url, tmp_path / "back", "deep", mover) == 1
    assert read_tree(tmp_path / "back") == {"deep/c.txt": "c" * 5000}


def test_a_single_file_url_downloads_by_its_name(tmp_path: Path) -> None:
    write_tree(tmp_path / "remote", {"model.pth": "m"})
    assert download((tmp_path / "remote" / "model.pth").as_uri(), tmp_path / "in") == 1
    assert read_tree(tmp_path / "in") == {"model.pth": "m"}


def test_listings_hide_partial_files_and_metadata(tmp_path: Path) -> None:
    write_tree(
        tmp_path / "remote",
        {
            "a.txt": "a",
            f"b.txt{storage.PARTIAL_MARK}1234": "half",
            ".trainyard/rounds/x.json": "{}",
        },
    )
    assert [f.rel for f in list_url(tmp_path / "remote")] == ["a.txt"]


def test_missing_url_is_a_data_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="absent.*does not exist"):
        download((tmp_path / "absent").as_uri(), tmp_path / "in")


def test_failed_file_names_the_file_and_cause_and_leaves_no_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_DATA_WORKERS", "1")
    src = write_tree(tmp_path / "src", {f"f{i}.txt": str(i) for i in range(4)})
    real = storage.put_file
    seen: list[str] = []

    def vanishing(*args: object, **kwargs: object) -> None:
        seen.append(str(args[2]))
        if len(seen) == 2:
            (src / "f2.txt").unlink()  # disappears right before its turn
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(storage, "put_file", vanishing)
    with pytest.raises(DataError) as caught:
        upload(tmp_path / "remote", [f"{src}/"], None)
    assert "f2.txt" in str(caught.value) and "FileNotFoundError" in str(caught.value)
    assert sorted(p.name for p in (tmp_path / "remote").iterdir()) == ["f0.txt", "f1.txt"]


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    size = 4 * 1024 * 1024
    src, remote = tmp_path / "src", tmp_path / "remote"
    src.mkdir()
    seen: set[int] = set()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            target = remote / "big.bin"
            if target.exists():
                seen.add(target.stat().st_size)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for round_ in range(4):
            (src / "big.bin").write_bytes(bytes([round_]) * size)
            upload(remote, [f"{src}/"])
    finally:
        done.set()
        thread.join()
    assert seen == {size}
