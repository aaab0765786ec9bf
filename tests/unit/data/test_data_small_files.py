"""Many small files through a dataset (issue 11, small files at ``cp -r`` speed): any tree
goes up and comes back byte for byte with the manifest's sizes and digests (hypothesis, real
files and real copies through the one-read path and the buffered loop), the string joins
that replaced ``Path`` arithmetic name the same files, and the one-read copy of a file
whose size changed since its fstat reads on to the end as the loop did."""

from __future__ import annotations

import hashlib
import os
import posixpath
import tempfile
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.data import DatasetStore, Mover, localcopy
from trainyard.data.transfer import _joiner, plan_uploads
from trainyard.errors import DataError

_SEGMENT = st.text(st.sampled_from("abcXYZ019 _-.é'"), min_size=1, max_size=6).filter(
    lambda s: s not in (".", "..")
)
_REL = st.lists(_SEGMENT, min_size=1, max_size=3).map("/".join)
_TREE = st.dictionaries(_REL, st.binary(max_size=2500), min_size=1, max_size=25).filter(
    lambda tree: not any(a != b and b.startswith(a + "/") for a in tree for b in tree)
)
"""Relative path -> bytes; no path is another one's folder. Sizes around the 1 KiB test
buffer: empty, one read, several reads."""


def _digest(algo: str, data: bytes) -> str:
    return (blake3.blake3(data) if algo == "blake3" else hashlib.sha256(data)).hexdigest()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_TREE)
def test_any_tree_goes_up_and_comes_back_byte_for_byte(tree: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(localcopy, "BUFFER_BYTES", 1024)  # both ways: one read and the loop
        root = Path(tmp)
        for rel, data in tree.items():
            (root / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / "src" / rel).write_bytes(data)
        store = DatasetStore((root / "store").as_uri(), Mover())
        version = store.upload("ds", plan_uploads([f"{root / 'src'}/"], None))
        _, stats = store.download("ds", root / "back")

        assert {f.path: f.size for f in version.files} == {r: len(d) for r, d in tree.items()}
        for entry in version.files:
            algo = "blake3" if entry.blake3 else "sha256"
            assert entry.digest.split(":")[-1] == _digest(algo, tree[entry.path])
        assert _read_bytes(root / "back") == tree and stats.files == len(tree)


ROOTS = ["/", "/store", "/store/ds/data/1-abc"]


@given(root=st.sampled_from(ROOTS), rel=st.text(st.sampled_from("ab/. "), max_size=8))
def test_the_join_names_what_posixpath_and_location_join_name(root: str, rel: str) -> None:
    want = posixpath.join(root, rel.strip("/")) if rel else root
    assert _joiner(root)(rel) == want
    loc = Mover().location(root)
    assert _joiner(loc.root)(rel) == loc.join(rel)


@given(rel=_REL)
def test_a_download_target_is_the_file_path_arithmetic_named(rel: str) -> None:
    dest = Path("/tmp/some dest")
    assert _joiner(str(dest))(rel) == str(dest / rel)


@pytest.mark.parametrize(("actual", "stated"), [(20, 10), (20, 30), (0, 5), (5000, 100)])
def test_a_size_that_changed_since_the_fstat_is_copied_to_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, actual: int, stated: int
) -> None:
    monkeypatch.setattr(localcopy, "BUFFER_BYTES", 1024)
    data = os.urandom(actual)
    (tmp_path / "src").write_bytes(data)
    fd_in = os.open(tmp_path / "src", os.O_RDONLY)
    fd_out = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        hasher = blake3.blake3()
        assert localcopy._copy(fd_in, fd_out, stated, hasher, None) == actual
    finally:
        os.close(fd_in)
        os.close(fd_out)
    assert (tmp_path / "dst").read_bytes() == data
    assert hasher.hexdigest() == _digest("blake3", data)


def test_many_small_files_round_trip_in_nested_folders(tmp_path: Path) -> None:
    tree = {f"d{i // 100:02}/sub/f{i:04}.bin": bytes([i % 251]) * (i % 700) for i in range(600)}
    for rel, data in tree.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(data)
    store = DatasetStore()
    store.upload("many", plan_uploads([f"{tmp_path / 'src'}/"], None))
    store.download("many", tmp_path / "back")
    assert _read_bytes(tmp_path / "back") == tree


def _read_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_failed_download_names_both_ends_as_before(tmp_path: Path, home: Path) -> None:
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "x.bin").write_bytes(b"abc")
    store = DatasetStore()
    store.upload("ds", plan_uploads([f"{tmp_path / 'src'}/"], None))
    stored = next((home / "datasets" / "ds" / "data").rglob("x.bin"))
    stored.write_bytes(b"abd")  # damaged in the store: every attempt fails the check
    with pytest.raises(DataError) as failed:
        store.download("ds", tmp_path / "back")
    assert f"sub/x.bin (file://{stored} -> {tmp_path / 'back' / 'sub' / 'x.bin'})" in str(
        failed.value
    )
    assert not (tmp_path / "back" / "sub" / "x.bin").exists()
