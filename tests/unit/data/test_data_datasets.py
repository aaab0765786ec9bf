"""Datasets on file://: versions, tags, latest, deletes, concurrent writers, integrity."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from data_unit_support import read_tree, write_tree

from trainyard.data import DatasetStore, parse_ref, storage
from trainyard.data.transfer import fast_digest_algo, plan_uploads
from trainyard.errors import DataError, NotFoundError


def _upload(store: DatasetStore, name: str, root: Path, tag: str | None = None) -> int:
    return store.upload(name, plan_uploads([f"{root}/"], None), tag).version


def test_versions_are_numbered_and_latest_is_the_newest(tmp_path: Path, home: Path) -> None:
    store = DatasetStore()
    assert store.url == (home / "datasets").as_uri()
    assert _upload(store, "ds", write_tree(tmp_path / "a", {"x.txt": "1"})) == 1
    assert _upload(store, "ds", write_tree(tmp_path / "b", {"x.txt": "2", "y.txt": "y"})) == 2
    assert store.names() == ["ds"]
    assert store.resolve("ds").version == 2 and store.resolve("ds:latest").version == 2
    assert store.resolve("ds:1").files[0].size == 1
    store.download("ds:1", tmp_path / "d1")
    assert read_tree(tmp_path / "d1") == {"x.txt": "1"}


def test_manifest_lists_size_and_sha256(tmp_path: Path) -> None:
    store = DatasetStore()
    _upload(store, "ds", write_tree(tmp_path / "a", {"x.txt": "abc"}))
    (entry,) = store.resolve("ds").files
    assert (entry.path, entry.size) == ("x.txt", 3)
    if fast_digest_algo() == "blake3":  # the blake3 package installed (a dependency)
        assert entry.blake3 == "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    else:
        assert entry.sha256 == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_a_version_written_with_sha256_still_downloads_and_is_checked(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trainyard.data.datasets as datasets_module

    monkeypatch.setattr(datasets_module, "fast_digest_algo", lambda: "sha256")  # as before blake3
    store = DatasetStore()
    _upload(store, "old", write_tree(tmp_path / "a", {"x.txt": "abc"}))
    (entry,) = store.resolve("old").files
    assert (entry.sha256, entry.blake3) == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        None,
    )
    store.download("old", tmp_path / "out")
    assert (tmp_path / "out" / "x.txt").read_text() == "abc"
    next((home / "datasets" / "old" / "data").rglob("x.txt")).write_text("abd")
    with pytest.raises(DataError, match=r"x\.txt.*sha256"):
        store.download("old", tmp_path / "out2")


def test_tags_point_at_versions_and_move(tmp_path: Path) -> None:
    store = DatasetStore()
    _upload(store, "ds", write_tree(tmp_path / "a", {"x.txt": "1"}), tag="gold")
    _upload(store, "ds", write_tree(tmp_path / "b", {"x.txt": "2"}))
    assert store.info("ds").tags == {"gold": 1, "latest": 2}
    store.tag("ds", "2", "gold")
    assert store.resolve("ds:gold").version == 2


@pytest.mark.parametrize("tag", ["latest", "3", "-x", "a b"])
def test_bad_tags_are_refused(tmp_path: Path, tag: str) -> None:
    store = DatasetStore()
    _upload(store, "ds", write_tree(tmp_path / "a", {"x.txt": "1"}))
    with pytest.raises(DataError, match="bad tag"):
        store.tag("ds", "1", tag)


def test_unknown_names_versions_and_paths_are_not_found(tmp_path: Path) -> None:
    store = DatasetStore()
    with pytest.raises(NotFoundError, match="no dataset 'nope'"):
        store.resolve("nope")
    _upload(store, "ds", write_tree(tmp_path / "a", {"x.txt": "1"}))
    with pytest.raises(NotFoundError, match=r"no version or tag '7' \(has: 1, latest\)"):
        store.resolve("ds:7")
    with pytest.raises(NotFoundError, match="no path 'sub'"):
        store.download("ds", tmp_path / "out", path="sub")
    with pytest.raises(DataError, match="bad dataset name"):
        parse_ref("../etc")


def test_download_path_and_regex_select_inside_the_dataset(tmp_path: Path) -> None:
    store = DatasetStore()
    _upload(
        store,
        "ds",
        write_tree(tmp_path / "a", {"m/w.pt": "w", "m/o.pt": "o", "m/l.txt": "l", "r.txt": "r"}),
    )
    _version, stats = store.download("ds", tmp_path / "out", path="m", regex=r"\.pt$")
    assert stats.files == 2 and read_tree(tmp_path / "out") == {"o.pt": "o", "w.pt": "w"}
    store.download("ds", tmp_path / "one", path="r.txt")
    assert read_tree(tmp_path / "one") == {"r.txt": "r"}


def test_deleted_version_disappears_and_its_number_is_not_reused(tmp_path: Path) -> None:
    store = DatasetStore()
    root = write_tree(tmp_path / "a", {"x.txt": "1"})
    for _ in range(3):
        _upload(store, "ds", root)
    store.tag("ds", "3", "gold")
    assert store.delete("ds", "gold") == [3]
    assert [v.version for v in store.versions("ds")] == [1, 2]
    assert store.info("ds").tags == {"latest": 2}
    assert _upload(store, "ds", root) == 4
    assert store.delete("ds") == [1, 2, 4]
    assert store.names() == []


def test_failed_upload_leaves_no_version_and_no_files(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_DATA_WORKERS", "1")
    root = write_tree(tmp_path / "a", {f"f{i}.txt": str(i) for i in range(5)})
    files = plan_uploads([f"{root}/"], None)
    real = storage.copy_hashing  # a file:// upload copies and hashes in one pass
    count: list[int] = []

    def failing(*args: object, **kwargs: object) -> str:
        count.append(1)
        if len(count) == 3:
            raise PermissionError("disk says no")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(storage, "copy_hashing", failing)
    store = DatasetStore()
    with pytest.raises(DataError, match=r"f2\.txt.*PermissionError: disk says no"):
        store.upload("ds", files)
    assert store.versions("ds") == []
    assert not list((home / "datasets" / "ds" / "data").iterdir())


def test_a_damaged_stored_file_is_caught_on_download(tmp_path: Path, home: Path) -> None:
    store = DatasetStore()
    _upload(store, "ds", write_tree(tmp_path / "a", {"x.txt": "good", "y.txt": "y"}))
    stored = next((home / "datasets" / "ds" / "data").rglob("x.txt"))
    stored.write_text("evil")  # same size, other bytes
    with pytest.raises(DataError, match=r"x\.txt.*(sha256|blake3)"):
        store.download("ds", tmp_path / "out")
    assert not (tmp_path / "out" / "x.txt").exists()


def _writer(url: str, name: str, root: str, barrier: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    DatasetStore(url).upload("shared", plan_uploads([f"{root}/"], None))


def test_concurrent_writer_processes_get_distinct_whole_versions(
    tmp_path: Path, home: Path
) -> None:
    url = (home / "datasets").as_uri()
    roots = {w: write_tree(tmp_path / w, {f"{w}-{i}.txt": w for i in range(8)}) for w in "abcd"}
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(roots))
    procs = [
        context.Process(target=_writer, args=(url, w, str(r), barrier)) for w, r in roots.items()
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    versions = DatasetStore(url).versions("shared")
    assert [v.version for v in versions] == [1, 2, 3, 4]
    owners = sorted("".join(sorted({f.path[0] for f in v.files})) for v in versions)
    assert owners == ["a", "b", "c", "d"] and all(len(v.files) == 8 for v in versions)
