"""The copy process pool (``copypool``): a dataset's files sent to a ``ProcessPoolExecutor``
give what this process alone gives, and nothing is lost or left half-made when a worker fails
a file or dies mid-list.

Real processes, real files, real FIFOs to hold a worker mid-file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainyard.data import DatasetStore, Mover, copypool, storage
from trainyard.data.checkpoints import CheckpointWriter
from trainyard.data.transfer import FileJob, plan_uploads
from trainyard.errors import DataError

_USABLE_CPUS = copypool.usable_cpus
_WAIT_S = 60.0  # generous: the machine is shared and loaded; the tests wait for events


@pytest.fixture(autouse=True)
def small_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools for small test lists: a few files, chunks of 4 files, two CPUs assumed."""
    monkeypatch.setattr(copypool, "MIN_FILES", 4)
    monkeypatch.setattr(copypool, "CHUNK_FILES", 4)
    monkeypatch.setattr(copypool, "usable_cpus", lambda: 2)


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every pool started (``ProcessPoolExecutor`` objects)."""
    pools: list[object] = []
    real = copypool.start_pool

    def start(workers: int) -> object:
        pool = real(workers)
        pools.append(pool)
        return pool

    monkeypatch.setattr(copypool, "start_pool", start)
    return pools


def _holder_of(path: Path) -> int:
    """The pid of the process that has ``path`` open (a worker blocked in a FIFO), found in
    ``/proc``; waits for one."""
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        for fd_dir in Path("/proc").glob("[0-9]*/fd"):
            with contextlib.suppress(OSError):
                if any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                    pid = int(fd_dir.parent.name)
                    if pid != os.getpid():
                        return pid
        time.sleep(0.01)
    raise AssertionError(f"no process opened {path}")


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


_TREES = st.dictionaries(
    st.text(st.sampled_from("abc019 _-é"), min_size=1, max_size=5).map(lambda s: f"x/{s}"),
    st.binary(max_size=3000),
    min_size=4,
    max_size=30,
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(tree=_TREES)
def test_shared_with_a_worker_gives_what_this_process_alone_gives(
    tmp_path_factory: pytest.TempPathFactory, tree: dict[str, bytes]
) -> None:
    root = tmp_path_factory.mktemp("tree")
    for rel, data in tree.items():
        (root / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / rel).write_bytes(data)
    files = plan_uploads([f"{root / 'src'}/"], None)
    shared = DatasetStore((root / "shared").as_uri(), Mover())
    version = shared.upload("ds", files)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(copypool, "MIN_FILES", 10**9)  # this process alone
        alone = DatasetStore((root / "alone").as_uri(), Mover()).upload("ds", files)
    assert [(f.path, f.size, f.digest) for f in version.files] == [
        (f.path, f.size, f.digest) for f in alone.files
    ]
    _, stats = shared.download("ds", root / "back")
    assert _read(root / "back") == tree and stats.files == len(tree)
    assert stats.bytes == sum(map(len, tree.values()))
    assert not _partials(root)


def test_the_worker_really_copies_and_reports_sizes_and_digests(
    tmp_path: Path, spawned: list[object]
) -> None:
    tree = _tree(tmp_path / "src", 30)
    logs: list[str] = []
    store = DatasetStore(None, Mover(log=logs.append))
    version = store.upload("ds", plan_uploads([f"{tmp_path / 'src'}/"], None))
    store.download("ds", tmp_path / "back")
    assert len(spawned) == 2  # the upload's and the download's
    assert {f.path: f.size for f in version.files} == {r: len(d) for r, d in tree.items()}
    assert _read(tmp_path / "back") == tree
    assert not [line for line in logs if "helper" in line]


def test_no_worker_for_one_cpu_few_files_or_one_data_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spawned: list[object]
) -> None:
    _tree(tmp_path / "src", 10)
    files = plan_uploads([f"{tmp_path / 'src'}/"], None)
    monkeypatch.setattr(copypool, "usable_cpus", lambda: 1)
    DatasetStore((tmp_path / "a").as_uri(), Mover()).upload("ds", files)
    monkeypatch.setattr(copypool, "usable_cpus", lambda: 2)
    monkeypatch.setattr(copypool, "MIN_FILES", 11)
    DatasetStore((tmp_path / "b").as_uri(), Mover()).upload("ds", files)
    monkeypatch.setattr(copypool, "MIN_FILES", 4)
    monkeypatch.setenv("TRAINYARD_DATA_WORKERS", "1")
    DatasetStore((tmp_path / "c").as_uri(), Mover()).upload("ds", files)
    assert spawned == []
    monkeypatch.delenv("TRAINYARD_DATA_WORKERS")
    DatasetStore((tmp_path / "d").as_uri(), Mover()).upload("ds", files)
    assert len(spawned) == 1


def test_pays_needs_two_cpus_of_this_process_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(copypool, "usable_cpus", _USABLE_CPUS)  # the real one, not the fixture's
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert copypool.usable_cpus() == 1 and not copypool.pays(10**6)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 3})
    assert copypool.usable_cpus() == 2
    assert copypool.pays(copypool.MIN_FILES) and not copypool.pays(copypool.MIN_FILES - 1)


def test_confined_files_are_never_sent_to_the_worker(tmp_path: Path, spawned: list[object]) -> None:
    """A task's folder (checkpoints, outputs) is read only through safefs in this process."""
    tree = _tree(tmp_path / "ckpt", 12)
    outside = tmp_path / "secret"
    outside.write_text("host file")
    (tmp_path / "ckpt" / "link.bin").symlink_to(outside)
    writer, state = CheckpointWriter((tmp_path / "remote").as_uri(), Mover()), {}
    assert writer.upload_round(tmp_path / "ckpt", None, state) == len(tree)
    assert spawned == []
    assert set(writer.entries) == set(tree)
    action = Mover().upload_action(Mover().location(tmp_path / "x"), digest=True)
    job = FileJob(
        "a", str(tmp_path / "ckpt" / "d0/f000.bin"), str(tmp_path / "x" / "a"), 1, confined=True
    )
    assert not action.offload.sends(job)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- failure paths


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
    tmp_path: Path, spawned: list[object]
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
    assert len(spawned) == 2  # the upload's and the download's
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


def _fifo_in_place_of(path: Path) -> bytes:
    data = path.read_bytes()
    path.unlink()
    os.mkfifo(path)
    return data


def _restore_when_lost(path: Path, data: bytes, logs: list[str]) -> Mover:
    """A mover whose log puts ``data`` back at ``path`` (a file again) once the worker is
    reported lost: the file is then redone in this process from the real file."""

    def log(line: str) -> None:
        logs.append(line)
        if "copy helper process lost" in line and stat.S_ISFIFO(path.lstat().st_mode):
            path.unlink()
            path.write_bytes(data)

    return Mover(log=log)


def _worker_blocked_on(fifo: Path) -> int:
    """Open ``fifo`` for writing once a reader holds it open (the worker, blocked in it),
    returning the writer's descriptor."""
    deadline = time.monotonic() + _WAIT_S
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def test_a_worker_killed_mid_file_loses_nothing_and_leaves_no_partial(
    tmp_path: Path, home: Path, spawned: list[object]
) -> None:
    tree = _tree(tmp_path / "src", 20)
    store = DatasetStore()
    store.upload("ds", plan_uploads([f"{tmp_path / 'src'}/"], None))
    fifo = _stored(home, "ds", "d1/f010.bin")
    data = _fifo_in_place_of(fifo)
    logs: list[str] = []
    store = DatasetStore(None, _restore_when_lost(fifo, data, logs))
    writer: list[int] = []

    def kill_mid_file() -> None:
        writer.append(_worker_blocked_on(fifo))
        os.write(writer[0], data[:100])  # the worker has started this file: half written
        time.sleep(0.2)
        os.kill(_holder_of(fifo), signal.SIGKILL)

    killer = threading.Thread(target=kill_mid_file)
    killer.start()
    try:
        store.download("ds", tmp_path / "back")
    finally:
        killer.join()
        for fd in writer:
            os.close(fd)
    assert _read(tmp_path / "back") == tree
    assert not _partials(tmp_path / "back")
    assert [line for line in logs if "copy helper process lost" in line]


def test_a_worker_killed_mid_upload_loses_nothing(tmp_path: Path, spawned: list[object]) -> None:
    tree = _tree(tmp_path / "src", 20)
    files = plan_uploads([f"{tmp_path / 'src'}/"], None)
    fifo = tmp_path / "src" / "d2" / "f011.bin"
    data = _fifo_in_place_of(fifo)
    logs: list[str] = []
    store = DatasetStore(None, _restore_when_lost(fifo, data, logs))
    writer: list[int] = []

    def kill_mid_file() -> None:
        writer.append(_worker_blocked_on(fifo))
        os.write(writer[0], data[:100])
        time.sleep(0.2)
        os.kill(_holder_of(fifo), signal.SIGKILL)

    killer = threading.Thread(target=kill_mid_file)
    killer.start()
    try:
        version = store.upload("ds", files)
    finally:
        killer.join()
        for fd in writer:
            os.close(fd)
    assert {f.path: f.size for f in version.files} == {r: len(d) for r, d in tree.items()}
    store.download("ds", tmp_path / "back")
    assert _read(tmp_path / "back") == tree


def test_a_failure_here_kills_the_worker_at_once(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch, spawned: list[object]
) -> None:
    """A file this process must do (a large one) fails for good: the transfer stops and the
    worker does not outlive it."""
    monkeypatch.setattr(copypool, "MAX_FILE_BYTES", 3005)
    _tree(tmp_path / "src", 20)
    files = plan_uploads([f"{tmp_path / 'src'}/"], None)
    (tmp_path / "src" / "d1" / "f019.bin").unlink()  # 3019 bytes: done here, fails
    store = DatasetStore()
    with pytest.raises(DataError, match=r"d1/f019\.bin"):
        store.upload("ds", files)
    assert len(spawned) == 1 and spawned[0]._processes is None  # type: ignore[attr-defined]
    assert store.versions("ds") == []


def test_a_worker_that_cannot_start_leaves_the_work_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(_workers: int) -> object:
        raise OSError("no process may start")

    monkeypatch.setattr(copypool, "start_pool", refused)
    tree = _tree(tmp_path / "src", 12)
    logs: list[str] = []
    store = DatasetStore(None, Mover(log=logs.append))
    store.upload("ds", plan_uploads([f"{tmp_path / 'src'}/"], None))
    store.download("ds", tmp_path / "back")
    assert _read(tmp_path / "back") == tree
    assert [
        line for line in logs if "copy helper process lost (OSError: no process may start" in line
    ]


def test_the_worker_loop_reports_each_file_and_goes_on(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    odd = tmp_path / "new\nline \udcff"  # any byte but NUL is a path byte
    orders = [
        copypool.CopyOrder(str(tmp_path / "a"), str(odd), None, "sha256"),
        copypool.CopyOrder(
            str(tmp_path / "missing"), str(tmp_path / "c"), str(tmp_path / "c.partial"), "sha256"
        ),
        copypool.CopyOrder(str(tmp_path / "a"), str(tmp_path / "d"), None, "md5"),
    ]
    ok, missing, unknown = copypool.copy_chunk(orders)
    assert ok == copypool.Copied(
        3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert isinstance(missing, str) and missing.startswith("FileNotFoundError")
    assert isinstance(unknown, str) and "md5" in unknown
    assert odd.read_bytes() == b"abc"
    assert not (tmp_path / "c").exists() and not (tmp_path / "c.partial").exists()


def test_a_failure_while_taking_the_answers_redoes_the_whole_chunk_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in this process's handling of an answer (here: the first accepted file of a
    download) loses the worker, never a file: its whole chunk is done here."""
    tree = _tree(tmp_path / "src", 12)
    store = DatasetStore()
    store.upload("ds", plan_uploads([f"{tmp_path / 'src'}/"], None))
    calls: list[int] = []
    real = Mover.download_action

    def download_action(self: Mover, loc: object) -> object:
        action = real(self, loc)  # type: ignore[arg-type]
        accept = action.offload.accept  # type: ignore[attr-defined]

        def failing_once(job: FileJob, copied: copypool.Copied) -> object:
            calls.append(1)
            if len(calls) == 2:
                raise PermissionError("cannot check")
            return accept(job, copied)

        object.__setattr__(action.offload, "accept", failing_once)  # type: ignore[attr-defined]
        return action

    monkeypatch.setattr(Mover, "download_action", download_action)
    logs: list[str] = []
    _, stats = DatasetStore(None, Mover(log=logs.append)).download("ds", tmp_path / "back")
    assert _read(tmp_path / "back") == tree and len(stats.digests) == len(tree)
    assert [line for line in logs if "copy helper process lost (PermissionError" in line]
