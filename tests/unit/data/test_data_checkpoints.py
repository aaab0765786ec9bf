"""Checkpoint rounds on file://: committed by a manifest, read back whole, never a mix."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from data_unit_support import read_tree, write_tree

from trainyard.data import Mover, checkpoints, download
from trainyard.data.checkpoints import CheckpointWriter
from trainyard.errors import DataError


def _rounds(remote: Path) -> list[str]:
    return sorted(p.name for p in (remote / ".trainyard" / "rounds").iterdir())


def test_rounds_upload_what_changed_and_commit_a_manifest(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "ckpt", {"model.pt": "m1", "opt.pt": "o1", "notes.txt": "n"})
    remote = tmp_path / "remote"
    writer, state = CheckpointWriter(remote.as_uri(), Mover()), {}
    assert writer.upload_round(src, r"\.pt$", state) == 2
    assert writer.upload_round(src, r"\.pt$", state) == 0  # nothing changed: no round
    (src / "model.pt").write_text("m2!")
    assert writer.upload_round(src, r"\.pt$", state) == 1
    assert _rounds(remote) == ["2.json"]  # older manifests are dropped once published
    manifest = json.loads((remote / ".trainyard" / "rounds" / "2.json").read_text())
    assert [(f["path"], f["size"], f["round"]) for f in manifest["files"]] == [
        ("model.pt", 3, 2),
        ("opt.pt", 2, 1),
    ]
    assert read_tree(remote) == {
        "model.pt": "m2!",
        "opt.pt": "o1",
        ".trainyard/rounds/2.json": (remote / ".trainyard/rounds/2.json").read_text(),
    }


def test_a_deleted_local_file_leaves_the_set(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "ckpt", {"a.pt": "a", "b.pt": "b"})
    remote = tmp_path / "remote"
    writer, state = CheckpointWriter(remote.as_uri(), Mover()), {}
    writer.upload_round(src, None, state)
    (src / "b.pt").unlink()
    assert writer.upload_round(src, None, state) == 0
    assert download(remote.as_uri(), tmp_path / "back") == 1
    assert read_tree(tmp_path / "back") == {"a.pt": "a"}
    assert "b.pt" not in state


def test_a_round_that_fails_before_its_commit_does_not_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tree(tmp_path / "ckpt", {"a.pt": "a1", "b.pt": "b1"})
    remote = tmp_path / "remote"
    writer, state = CheckpointWriter(remote.as_uri(), Mover()), {}
    writer.upload_round(src, None, state)
    write_tree(src, {"a.pt": "a2", "b.pt": "b2"})
    monkeypatch.setattr(checkpoints.storage, "create_exclusive", _raise(OSError(5, "disk full")))
    with pytest.raises(DataError, match="disk full"):
        writer.upload_round(src, None, state)
    assert download(remote.as_uri(), tmp_path / "back") == 2
    assert read_tree(tmp_path / "back") == {"a.pt": "a1", "b.pt": "b1"}


def test_a_publish_that_dies_midway_still_reads_back_the_committed_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = write_tree(tmp_path / "ckpt", {"a.pt": "a1", "b.pt": "b1"})
    remote = tmp_path / "remote"
    writer, state = CheckpointWriter(remote.as_uri(), Mover()), {}
    writer.upload_round(src, None, state)
    write_tree(src, {"a.pt": "a2", "b.pt": "b2"})
    real_move, moved = checkpoints._move, []

    def dies_after_one(*args: object) -> None:
        if moved:
            raise OSError(5, "node lost")
        moved.append(args)
        real_move(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoints, "_move", dies_after_one)
    with pytest.raises(DataError, match="node lost"):
        writer.upload_round(src, None, state)
    assert read_tree(remote)["a.pt"] == "a2" and read_tree(remote)["b.pt"] == "b1"  # a mix ...
    assert download(remote.as_uri(), tmp_path / "back") == 2
    assert read_tree(tmp_path / "back") == {"a.pt": "a2", "b.pt": "b2"}  # ... never read as one
    monkeypatch.undo()
    assert writer.upload_round(src, None, state) == 1  # b.pt is sent again
    assert {k: v for k, v in read_tree(remote).items() if not k.startswith(".")} == {
        "a.pt": "a2",
        "b.pt": "b2",
    }


def test_a_rescheduled_writer_continues_the_numbering(tmp_path: Path) -> None:
    src = write_tree(tmp_path / "ckpt", {"a.pt": "1"})
    remote = tmp_path / "remote"
    CheckpointWriter(remote.as_uri(), Mover()).upload_round(src, None, {})
    write_tree(src, {"a.pt": "2"})
    assert CheckpointWriter(remote.as_uri(), Mover()).upload_round(src, None, {}) == 1
    assert _rounds(remote) == ["2.json"]
    download(remote.as_uri(), tmp_path / "back")
    assert read_tree(tmp_path / "back") == {"a.pt": "2"}


def test_readers_see_one_whole_round_while_a_writer_keeps_going(tmp_path: Path) -> None:
    src, remote = tmp_path / "ckpt", tmp_path / "remote"
    names = ["model.pt", "optim.pt", "sched.pt"]
    writer, state = CheckpointWriter(remote.as_uri(), Mover()), {}
    write_tree(src, {n: "r0" for n in names})
    writer.upload_round(src, None, state)
    stop = threading.Event()

    def keep_writing() -> None:
        round_ = 0
        while not stop.is_set():
            round_ += 1
            write_tree(src, {n: f"r{round_}-" + "x" * (round_ * 997 % 50_000) for n in names})
            writer.upload_round(src, None, state)

    thread = threading.Thread(target=keep_writing)
    thread.start()
    reads, deadline = 0, time.monotonic() + 2.0
    try:
        while time.monotonic() < deadline:
            out = tmp_path / f"read-{reads}"
            download(remote.as_uri(), out)
            got = read_tree(out)
            assert sorted(got) == names
            assert len({v.split("-")[0] for v in got.values()}) == 1, got  # one round, whole
            reads += 1
    finally:
        stop.set()
        thread.join()
    assert reads >= 3


def _raise(exc: BaseException):  # type: ignore[no-untyped-def]
    def fail(*_args: object, **_kwargs: object) -> None:
        raise exc

    return fail


def test_a_reader_whose_listed_round_was_pruned_meanwhile_lists_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, remote = tmp_path / "ckpt", tmp_path / "remote"
    writer, state = CheckpointWriter(remote.as_uri(), Mover()), {}
    write_tree(src, {"model.pt": "r1"})
    writer.upload_round(src, None, state)
    write_tree(src, {"model.pt": "r2"})
    writer.upload_round(src, None, state)  # commits round 2, prunes round 1's manifest
    real, calls = checkpoints._rounds, []

    def stale_first(*args: object) -> list[int]:
        calls.append(1)  # call 1 is download's has_checkpoint; call 2 is the reader's listing
        return [1] if len(calls) == 2 else real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoints, "_rounds", stale_first)
    download(remote.as_uri(), tmp_path / "out")
    assert read_tree(tmp_path / "out") == {"model.pt": "r2"}


def test_a_failing_input_names_the_url_not_the_checkpoint_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: the first read of a download (its checkpoint rounds) failing is said with
    the URL the user wrote, never trainyard's ``.trainyard/rounds`` inside it."""
    from fsspec.implementations.local import LocalFileSystem

    remote = tmp_path / "remote"
    remote.mkdir()

    def refuse(_fs: object, path: str, **_kw: object) -> bool:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(LocalFileSystem, "exists", refuse)
    with pytest.raises(DataError) as caught:
        download(remote.as_uri(), tmp_path / "back")
    assert remote.as_uri() in str(caught.value)
    assert ".trainyard" not in str(caught.value)
