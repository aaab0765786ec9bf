"""Snapshots are written atomically, verified when read, and never half-loaded."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainyard.training import snapshot as snap
from trainyard.training.errors import SnapshotCorruptError, SnapshotError


def _state(epochs: int = 3, fill: float = 0.25) -> dict:
    model = {"w": torch.full((64, 32), fill), "b": torch.arange(32, dtype=torch.float32)}
    return {
        "epochs_completed": epochs,
        "model": model,
        "optimizer": {
            "state": {0: {"momentum_buffer": torch.ones(3)}},
            "param_groups": [{"lr": 0.1}],
        },
        "scheduler": {"last_epoch": epochs},
        "rng": snap.capture_rng_state(),
    }


def test_roundtrip_keeps_every_tensor_and_value(tmp_path: Path) -> None:
    path = tmp_path / "models" / "snapshot.pth"
    snap.save_snapshot(path, _state())
    loaded = snap.load_snapshot(path)
    assert loaded is not None
    assert loaded["epochs_completed"] == 3
    assert torch.equal(loaded["model"]["w"], torch.full((64, 32), 0.25))
    assert loaded["format"] == snap.SNAPSHOT_FORMAT
    assert loaded["sha256"] == snap.state_digest(_state() | {"rng": loaded["rng"]})


def test_missing_snapshot_is_none(tmp_path: Path) -> None:
    assert snap.load_snapshot(tmp_path / "absent.pth") is None


def test_a_crash_while_writing_leaves_the_old_snapshot_and_no_temp_file(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "snapshot.pth"
    snap.save_snapshot(path, _state(epochs=2))
    newer = snap.encode_snapshot(_state(epochs=5))

    def torn_save(obj, handle):  # writes part of the file, then the "machine dies"
        handle.write(newer[:1000])
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(snap.torch, "save", torn_save)
    with pytest.raises(KeyboardInterrupt):
        snap.save_snapshot(path, _state(epochs=5))
    monkeypatch.undo()
    assert snap.load_snapshot(path)["epochs_completed"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["snapshot.pth"]


def test_a_partial_temp_file_beside_the_snapshot_is_never_loaded(tmp_path: Path) -> None:
    """What a kill -9 during save leaves behind: a temp file; readers only open the real name."""
    good = snap.encode_snapshot(_state(epochs=1))
    newer = snap.encode_snapshot(_state(epochs=9))
    (tmp_path / ".snapshot.pth.abc123.tmp").write_bytes(newer[: len(newer) // 2])
    assert snap.load_snapshot(tmp_path / "snapshot.pth") is None
    (tmp_path / "snapshot.pth").write_bytes(good)
    assert snap.load_snapshot(tmp_path / "snapshot.pth")["epochs_completed"] == 1


@pytest.mark.parametrize("cut", [0, 10, 0.5, -1])
def test_truncated_file_is_refused(tmp_path: Path, cut) -> None:
    data = snap.encode_snapshot(_state())
    end = int(len(data) * cut) if isinstance(cut, float) else (len(data) + cut if cut < 0 else cut)
    path = tmp_path / "snapshot.pth"
    path.write_bytes(data[:end])
    with pytest.raises(SnapshotCorruptError):
        snap.load_snapshot(path)


def test_a_flipped_byte_in_tensor_data_is_caught_by_the_digest(tmp_path: Path) -> None:
    data = bytearray(snap.encode_snapshot(_state(fill=0.25)))
    marker = torch.full((64, 32), 0.25).numpy().tobytes()
    start = bytes(data).find(marker)
    assert start > 0, "tensor bytes are stored verbatim in torch's zip format"
    data[start + len(marker) // 2] ^= 0x01
    path = tmp_path / "snapshot.pth"
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotCorruptError, match="digest"):
        snap.load_snapshot(path)


def test_other_torch_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "snapshot.pth"
    torch.save({"MODEL_STATE": {}, "EPOCHS_RUN": 3}, path)  # OSMO sample's layout
    with pytest.raises(SnapshotCorruptError, match="not a trainyard-snapshot"):
        snap.load_snapshot(path)


def test_a_snapshot_without_required_keys_is_neither_written_nor_read(tmp_path: Path) -> None:
    state = _state()
    del state["optimizer"]
    with pytest.raises(SnapshotError, match="optimizer"):
        snap.save_snapshot(tmp_path / "s.pth", state)
    assert not (tmp_path / "s.pth").exists()
    payload = {**state, "format": snap.SNAPSHOT_FORMAT, "sha256": snap.state_digest(state)}
    torch.save(payload, tmp_path / "s.pth")
    with pytest.raises(SnapshotCorruptError, match="optimizer"):
        snap.load_snapshot(tmp_path / "s.pth")


def test_code_in_a_snapshot_is_not_run(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    path = tmp_path / "snapshot.pth"
    torch.save({**_state(), "x": Evil()}, path)
    with pytest.raises(SnapshotCorruptError):
        snap.load_snapshot(path)
    assert not (tmp_path / "pwned").exists()


def test_file_mode_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        snap.save_snapshot(tmp_path / "s.pth", _state())
    finally:
        os.umask(old)
    assert (tmp_path / "s.pth").stat().st_mode & 0o777 == 0o644


def test_rng_state_roundtrips_through_a_snapshot(tmp_path: Path) -> None:
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    snap.save_snapshot(tmp_path / "s.pth", _state())
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    snap.restore_rng_state(snap.load_snapshot(tmp_path / "s.pth")["rng"])
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
