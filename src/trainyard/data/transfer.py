"""Moving many files: a pool of workers, one retried job per file, progress, throughput.

``Mover`` runs a list of ``FileJob`` with ``DataConfig.workers`` threads. Each job is
retried on transient errors (``retry.with_retry``, logged). The first job that fails for
good stops the transfer: jobs not yet started are dropped, the ones running finish, and a
``DataError`` names the file, both ends and the cause. A finished transfer logs one
throughput line (``uploaded 12 file(s), 1.2 GiB in 3.4 s (361 MiB/s) to s3://...``).

Regex rule (OSMO docs, "Inputs and Outputs": "regex filtering on what to include"): a file
is taken when ``re.search(regex, rel)`` matches, ``rel`` being its path relative to the
folder (or URL) being transferred, with ``/`` separators.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import operator
import os
import posixpath
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from fsspec.callbacks import Callback

from trainyard.data import copyworker, storage
from trainyard.data.config import DataConfig, load_config
from trainyard.data.progress import NullProgress, TransferProgress
from trainyard.data.retry import ChecksumMismatch, RetryPolicy, with_retry
from trainyard.data.runnerhook import file_filter
from trainyard.data.scrub import scrub
from trainyard.data.storage import Location, RemoteFile
from trainyard.errors import DataError
from trainyard.linux.safefs import files_inside, no_links_path

__all__ = [
    "FileJob",
    "LocalFile",
    "Moved",
    "TransferStats",
    "Mover",
    "file_filter",
    "local_files",
    "plan_uploads",
    "sha256_file",
    "human_size",
    "file_digest",
    "split_digest",
    "tag_digest",
    "fast_digest_algo",
]

_CHUNK = 4 * 1024 * 1024
SMALL_FILE_BYTES = 256 * 1024
"""Local transfers whose files average less than this run in one thread (``Mover.run``)."""
Log = Callable[[str], None]


def human_size(nbytes: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes:.0f} B"


def sha256_file(path: Path) -> str:
    """The hex sha256 of a local file. Raises OSError."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def split_digest(digest: str) -> tuple[str, str]:
    """``blake3:HEX`` -> (``blake3``, HEX); a bare HEX is a sha256 (every manifest written
    before BLAKE3 was used)."""
    algo, sep, value = digest.partition(":")
    return (algo, value) if sep else ("sha256", digest)


def tag_digest(algo: str, value: str) -> str:
    """The inverse of ``split_digest``: sha256 stays bare, others get ``ALGO:``."""
    return value if algo == "sha256" else f"{algo}:{value}"


def file_digest(path: Path, algo: str = "sha256") -> str:
    """The hex digest (``storage.new_hasher``) of a local file. Raises OSError, DataError."""
    digest = storage.new_hasher(algo)
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fast_digest_algo() -> str:
    """``blake3`` when its package is installed (about 3x faster than sha256 here, which is
    what bounds a dataset copy: docs/benchmarks-history.md), else ``sha256``."""
    try:
        import blake3  # noqa: F401 - availability only
    except ImportError:
        return "sha256"
    return "blake3"


@dataclass(frozen=True)
class LocalFile:
    """A local file to upload and its path ``rel`` at the destination. ``confined``: it
    lies in a folder a task controls (``local_files(confined=True)``): ``path`` is its real
    path, opened following no symlink (``linux.safefs.open_no_links``)."""

    path: Path
    rel: str
    size: int
    confined: bool = False


def local_files(
    root: Path,
    keep: Callable[[str], bool],
    prefix: str = "",
    confined: bool = False,
    log: Log | None = None,
) -> list[LocalFile]:
    """Files below ``root`` (or ``root`` itself when it is a file) whose path relative to
    ``root`` passes ``keep``; their ``rel`` is ``prefix`` + that path. Sorted by ``rel``.

    Args:
        confined: ``root`` is a folder a task wrote (its output, a checkpoint folder): follow
            no symlink out of it (``linux.safefs.files_inside``: a link to a file inside is
            kept under its own name, any other link is skipped with a line to ``log``), and
            read each file following no link (``LocalFile.confined``). Without it (the
            user's own ``dataset upload``), links are followed as ``cp -rL`` would.

    Raises:
        DataError: ``root`` does not exist.
    """
    if confined:
        if not root.exists():
            raise DataError(f"{root}: no such file or folder")
        try:
            inside = files_inside(root, log)
        except OSError as exc:
            raise DataError(f"{root}: cannot be listed: {exc}") from exc
        chosen_inside = [
            (p, rel) for p, rel in inside if keep(rel) and not storage.is_reserved(rel)
        ]
        return sorted(
            (
                LocalFile(p, prefix + rel, p.stat().st_size, confined=True)
                for p, rel in chosen_inside
            ),
            key=lambda f: f.rel,
        )
    if root.is_file():
        found = [(root.absolute(), root.name, root.stat().st_size)]
    elif root.is_dir():
        found = _files_below(root.absolute())
    else:
        raise DataError(f"{root}: no such file or folder")
    chosen = [
        LocalFile(p, prefix + rel, size)
        for p, rel, size in found
        if keep(rel) and not storage.is_reserved(rel)
    ]
    chosen.sort(key=_BY_REL)
    return chosen


_BY_REL = operator.attrgetter("rel")


def _files_below(root: Path) -> list[tuple[Path, str, int]]:
    """(path, path relative to ``root``, size) of every file below ``root``, as
    ``root.rglob("*")`` filtered by ``is_file()`` finds them (a link to a file counts with
    its target's size, a linked folder is not entered, an unreadable folder is passed
    over), with one ``stat`` per file and none per folder (``os.scandir``'s entry types):
    listing costs as much per file as ``cp -r``'s, not three calls."""
    found: list[tuple[Path, str, int]] = []
    folders = [(root, "")]
    while folders:
        folder, rel = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except PermissionError:
            continue
        for entry in entries:
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                folders.append((folder / name, f"{rel}{name}/"))
            elif entry.is_file():  # a child of the folder's Path: cheaper than Path(str)
                found.append((folder / name, rel + name, entry.stat().st_size))
    return found


def plan_uploads(paths: Sequence[str | Path], regex: str | None) -> list[LocalFile]:
    """The files of several local paths, named as ``rsync`` would name them.

    A file keeps its name; a folder keeps its name as a prefix (``data/a.txt``) unless
    given with a trailing ``/``, which uploads its contents (``a.txt``). The regex matches
    the path relative to the given folder.

    Raises:
        DataError: a path is missing, the regex is bad, or two files would get one name.
    """
    keep = file_filter(regex)
    listed = []
    for raw in paths:
        path = Path(raw)
        contents = str(raw).endswith(("/", os.sep)) or path.is_file()
        prefix = "" if contents else f"{path.resolve().name}/"
        listed.append(local_files(path, keep, prefix))
    if len(listed) == 1:
        return listed[0]  # one listing: sorted, one file per name already
    planned: dict[str, LocalFile] = {}
    for item in itertools.chain.from_iterable(listed):
        if item.rel in planned:
            raise DataError(
                f"two files would be uploaded as {item.rel!r}: "
                f"{planned[item.rel].path} and {item.path}"
            )
        planned[item.rel] = item
    return sorted(planned.values(), key=_BY_REL)


@dataclass(frozen=True)
class FileJob:
    """One file to move: ``rel`` names it in messages; ``sha256`` is the expected digest of
    a download (checked when set)."""

    rel: str
    source: str
    target: str
    size: int
    sha256: str | None = None
    where: str = ""
    confined: bool = False

    def describe(self) -> str:
        """``rel (from -> to)`` for messages (``where`` when the creator gave one), scrubbed."""
        return scrub(f"{self.rel} ({self.where or f'{self.source} -> {self.target}'})")


class _Described:
    """A job's description, built only when a message needs it (per-file cost matters)."""

    def __init__(self, job: FileJob) -> None:
        self.job = job

    def __str__(self) -> str:
        return self.job.describe()


class Moved(NamedTuple):
    """What a job action moved, where it counted it: the digest (``tag_digest`` form, None
    when none was asked) and the size in bytes of the very bytes sent (a file may
    change between its listing and its copy; a manifest records what was copied)."""

    digest: str | None
    size: int


@dataclass
class TransferStats:
    """What a transfer moved. ``digests`` maps ``rel`` to its digest where one was computed;
    ``sizes`` maps ``rel`` to the bytes moved where the action counted them (``Moved``;
    uploads do), else the listing's size. ``bytes`` sums those sizes."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    digests: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def summary(self, verb: str, where: str) -> str:
        """``uploaded 3 file(s), 1.0 MiB in 0.2 s (5.0 MiB/s) to URL``."""
        return (
            f"{verb} {self.files} file(s), {human_size(self.bytes)} in {self.seconds:.2f} s "
            f"({human_size(self.bytes_per_s)}/s) {where}"
        )


class _BytesCallback(Callback):
    """Forwards fsspec's byte counts to a ``TransferProgress``."""

    def __init__(self, progress: TransferProgress) -> None:
        super().__init__()
        self.progress = progress
        self.reported = 0

    def call(self, hook_name: str | None = None, **kwargs: Any) -> None:
        delta, self.reported = self.value - self.reported, self.value
        if delta > 0:
            self.progress.advance(delta)


JobAction = Callable[[FileJob, Callback], "str | Moved | None"]
"""Moves one file; returns its digest (or None), or ``Moved`` when it counted the bytes."""


@dataclass(frozen=True)
class Offload:
    """How an action's local copies may be done by a copy helper process (``copyworker``).

    ``sends(job)``: whether the job may be sent at all (not for a confined source, a remote
    end, no digest to take: the action does those itself). ``order(job)``: the
    ``CopyOrder`` that copies a sendable ``job`` exactly as the action would (same source,
    target and temp rule). ``accept(job, copied)``: what the action would have returned for
    that copy, or None when the copy is not acceptable (a digest other than the one
    expected): the job is then done by the action, with its retries.
    """

    sends: Callable[[FileJob], bool]
    order: Callable[[FileJob], copyworker.CopyOrder]
    accept: Callable[[FileJob, copyworker.Copied], str | Moved | None]


class _OffloadableAction:
    """A job action with an ``Offload`` (``Mover._execute`` looks for ``offload``)."""

    def __init__(self, action: JobAction, offload: Offload) -> None:
        self.action = action
        self.offload = offload

    def __call__(self, job: FileJob, callback: Callback) -> str | Moved | None:
        return self.action(job, callback)


class Mover:
    """Runs file jobs in parallel with retries, progress and a throughput log line.

    Args:
        config: data settings (default ``load_config()``).
        log: one-line messages (retries, throughput); default: none.
        progress: progress reporting; default: none.
    """

    def __init__(
        self,
        config: DataConfig | None = None,
        log: Log | None = None,
        progress: TransferProgress | None = None,
    ) -> None:
        self.config = config or load_config()
        self._log = log or (lambda _line: None)
        self.progress = progress or NullProgress()
        self.policy = RetryPolicy(self.config.retries, self.config.retry_backoff_s)

    def log(self, line: str) -> None:
        """Log one line, credentials masked."""
        self._log(scrub(line))

    def location(self, url: str | os.PathLike[str]) -> Location:
        """``url`` resolved with this mover's settings. Raises DataError."""
        return storage.open_location(url, self.config)

    def storage_call(self, what: str, action: Callable[[], Any]) -> Any:
        """Run one storage operation with retries; errors become ``DataError`` naming ``what``."""
        try:
            return with_retry(action, what, self.policy, self.log)
        except DataError:
            raise
        except Exception as exc:  # noqa: BLE001 - translated at the edge
            raise DataError(scrub(f"{what} failed: {_cause(exc)}")) from exc

    def list_files(self, loc: Location) -> list[RemoteFile]:
        """The files at ``loc`` (``storage.list_files``). Raises DataError."""
        return self.storage_call(f"listing {loc.show()}", lambda: storage.list_files(loc))

    # ------------------------------------------------------------------ running jobs

    def run(
        self,
        jobs: Sequence[FileJob],
        action: JobAction,
        label: str,
        loc: Location | None = None,
        helper: copyworker.Helper | None = None,
    ) -> TransferStats:
        """Run ``action`` on every job; each returns an optional digest, or ``Moved``
        (digest and the size of the bytes moved, recorded in ``TransferStats.sizes``).

        ``DataConfig.workers`` jobs run at once; with ``loc`` on ``file://`` at most one per
        CPU (local copies are bound by the CPU and the disk, not by latency), and one in all
        when the files average under ``SMALL_FILE_BYTES``: their cost is per-file work that
        holds the GIL, which two threads only fight over (measured on 5,000 files of 16 KiB:
        99 us per file in one thread, 142 us in two; docs/benchmarks-history.md). Such a transfer
        shares its files with a copy helper process instead where that pays
        (``copyworker``: an action with an ``Offload``, ``DataConfig.workers`` >= 2, enough
        files, two CPUs). ``helper``: a copy helper already started for this transfer
        (``early_helper``); used or ended here.

        Raises:
            DataError: a job failed for good: names its file, both ends and the cause.
        """
        stats = TransferStats()
        started = time.perf_counter()
        self.progress.start(label, len(jobs), sum(j.size for j in jobs))
        try:
            for job, result in self._execute(jobs, action, self._workers(loc, jobs), helper):
                _record(stats, job, result)
        finally:
            if helper is not None and not helper.fed:
                helper.abort()  # started early, not used after all
            self.progress.finish()
        stats.seconds = time.perf_counter() - started
        return stats

    def early_helper(
        self, loc: Location, count: int, total_bytes: int, sending: bool
    ) -> copyworker.Helper | None:
        """A copy helper started now, when ``run`` will share these files with one: a
        ``file://`` transfer with digests (``sending``) of enough small files, two CPUs,
        ``DataConfig.workers`` >= 2. Its start then overlaps building the jobs."""
        if (
            not (sending and loc.is_local and self.config.workers >= 2)
            or total_bytes >= SMALL_FILE_BYTES * count
            or not copyworker.pays(count)
        ):
            return None
        return copyworker.Helper(self.log).start()

    def _workers(self, loc: Location | None, jobs: Sequence[FileJob]) -> int:
        if loc is None or not loc.is_local:
            return self.config.workers
        if sum(job.size for job in jobs) < SMALL_FILE_BYTES * len(jobs):
            return 1
        return max(1, min(self.config.workers, os.cpu_count() or 1))

    def _execute(
        self,
        jobs: Sequence[FileJob],
        action: JobAction,
        workers: int,
        helper: copyworker.Helper | None = None,
    ) -> Iterable[tuple[FileJob, str | Moved | None]]:
        """Each worker thread takes the next job until none is left (one task per worker,
        not one future per file: with many small files the pool's per-job bookkeeping and
        hand-offs cost more than the copies). After a failure no job starts; the first
        error is raised."""
        offload: Offload | None = getattr(action, "offload", None)
        if (
            workers <= 1
            and offload is not None
            and self.config.workers >= 2
            and copyworker.pays(len(jobs))
        ):
            return self._execute_shared(jobs, action, offload, helper)
        if len(jobs) <= 1 or workers <= 1:
            return [(job, self._one(job, action)) for job in jobs]
        digests: list[str | Moved | None] = [None] * len(jobs)
        queue = iter(range(len(jobs)))
        stop = threading.Event()

        def work() -> None:
            for index in queue:  # next() on a shared iterator: each index is taken once
                if stop.is_set():
                    return
                try:
                    digests[index] = self._one(jobs[index], action)
                except BaseException:
                    stop.set()
                    raise

        with ThreadPoolExecutor(min(workers, len(jobs)), "trainyard-data") as pool:
            futures = [pool.submit(work) for _ in range(min(workers, len(jobs)))]
            done, _pending = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                stop.set()
                raise _first_error(failed)
        return list(zip(jobs, digests, strict=True))

    def _execute_shared(
        self,
        jobs: Sequence[FileJob],
        action: JobAction,
        offload: Offload,
        helper: copyworker.Helper | None,
    ) -> list[tuple[FileJob, str | Moved | None]]:
        """Share the jobs with a copy helper process (``copyworker``): this thread does the
        jobs that cannot be sent, then takes chunks from the queue the helper takes from;
        files the helper failed, copied unacceptably, or lost (a dead or hung worker) are
        done here afterwards with the action's retries. A job that fails for good here
        kills the helper and raises at once."""
        results: list[str | Moved | None] = [None] * len(jobs)
        limit, sends = copyworker.MAX_FILE_BYTES, offload.sends
        sent = [i for i, job in enumerate(jobs) if job.size < limit and sends(job)]
        if not copyworker.pays(len(sent)):
            return [(job, self._one(job, action)) for job in jobs]
        redo: list[int] = []

        def on_answer(index: int, answer: copyworker.Copied | str) -> None:
            job = jobs[index]
            got = offload.accept(job, answer) if isinstance(answer, copyworker.Copied) else None
            if got is None or not isinstance(answer, copyworker.Copied):
                redo.append(index)
                return
            results[index] = got
            self.progress.advance(answer.size)
            self.progress.file_done(job.rel)

        queue = copyworker.ChunkQueue(sent)
        helper = (helper or copyworker.Helper(self.log).start()).feed(
            queue, lambda i: offload.order(jobs[i]), on_answer
        )
        try:
            for index in sorted(set(range(len(jobs))).difference(sent)):
                results[index] = self._one(jobs[index], action)
            while (chunk := queue.take()) is not None:
                for index in chunk:
                    results[index] = self._one(jobs[index], action)
            helper.join()
            for index in sorted(redo + helper.lost):
                results[index] = self._one(jobs[index], action)
        except BaseException:
            helper.abort()
            raise
        return list(zip(jobs, results, strict=True))

    def _one(self, job: FileJob, action: JobAction) -> str | Moved | None:
        callback = _BytesCallback(self.progress)
        what = _Described(job)
        try:
            digest = with_retry(lambda: action(job, callback), what, self.policy, self.log)
        except Exception as exc:  # noqa: BLE001 - translated at the edge
            raise DataError(scrub(f"transfer of {what} failed: {_cause(exc)}")) from exc
        if job.size > callback.reported:
            self.progress.advance(job.size - callback.reported)
        self.progress.file_done(job.rel)
        return digest

    # ------------------------------------------------------------------ actions

    def upload_action(
        self, loc: Location, digest: bool, algo: str = "sha256", staged: bool = False
    ) -> JobAction:
        """A job action that uploads ``job.source`` (local) to ``job.target`` in ``loc`` and
        returns ``Moved``: the size of the bytes sent and, with ``digest``, their digest
        (``algo``; ``tag_digest`` form). The file must not change while it is sent (checked
        by size and mtime; a change fails the file); a change between the listing and the
        send is no error: what was sent is what is returned (a growing log must not fail a
        checkpoint round). ``staged``: ``loc`` is a folder no reader looks at before a
        manifest names its files, so a ``file://`` copy is written in place, without a
        temporary name (``storage.copy_hashing(atomic=False)``)."""

        hashed_copy = digest and loc.is_local  # asked once, not per file

        def sends(job: FileJob) -> bool:
            return hashed_copy and not job.confined  # a confined file: only safefs opens it

        def order(job: FileJob) -> copyworker.CopyOrder:
            temp = None if staged else storage.local_partial(job.target)
            return copyworker.CopyOrder(job.source, job.target, temp, algo)

        def accept(job: FileJob, copied: copyworker.Copied) -> Moved:
            return Moved(tag_digest(algo, copied.digest), copied.size)

        def action(job: FileJob, callback: Callback) -> Moved:
            if not job.confined:
                return send(job.source, job, callback)
            with no_links_path(job.source) as opened:  # the file listed, never a link
                return send(opened, job, callback)

        def send(source: str, job: FileJob, callback: Callback) -> Moved:
            if hashed_copy:  # one read: hashed while copied; a change is caught there
                copied = storage.copy_hashing(source, job.target, callback, algo, atomic=not staged)
                return Moved(tag_digest(algo, copied.digest), copied.size)
            local = Path(source)
            before = _stamp(local)
            if not digest:
                storage.put_file(loc, local, job.target, callback)
                return Moved(None, before[1])
            value, hashed = _digest_counted(local, algo)
            storage.put_file(loc, local, job.target, callback)
            if _stamp(local) != before or hashed != before[1]:
                raise _ChangedWhileSending(f"{local} changed while it was uploaded")
            return Moved(tag_digest(algo, value), hashed)

        return _OffloadableAction(action, Offload(sends, order, accept))

    def download_action(self, loc: Location) -> JobAction:
        """A job action that downloads ``job.source`` from ``loc`` to ``job.target`` (local),
        checking ``job.sha256`` when set (a digest in ``tag_digest`` form: sha256 or
        ``blake3:HEX``; a mismatch removes the file and is retried)."""

        local = loc.is_local  # asked once, not per file

        def sends(job: FileJob) -> bool:
            return local and job.sha256 is not None

        def order(job: FileJob) -> copyworker.CopyOrder:
            algo, _want = split_digest(str(job.sha256))
            return copyworker.CopyOrder(
                job.source, job.target, storage.local_partial(job.target), algo
            )

        def accept(job: FileJob, copied: copyworker.Copied) -> str | None:
            if split_digest(str(job.sha256))[1] == copied.digest:
                return job.sha256
            Path(job.target).unlink(missing_ok=True)  # not what the manifest says: redone
            return None

        def action(job: FileJob, callback: Callback) -> str | None:
            if job.sha256 is None:
                storage.get_file(loc, job.source, Path(job.target), callback)
                return None
            algo, want = split_digest(job.sha256)
            if local:  # one read: hashed while copied
                got = storage.copy_hashing(job.source, job.target, callback, algo).digest
            else:
                storage.get_file(loc, job.source, Path(job.target), callback)
                got = file_digest(Path(job.target), algo)
            if got != want:
                Path(job.target).unlink(missing_ok=True)
                raise ChecksumMismatch(f"{algo} {got[:12]}... is not the expected {want[:12]}...")
            return job.sha256

        return _OffloadableAction(action, Offload(sends, order, accept))

    # ------------------------------------------------------------------ plain transfers

    def upload_files(
        self,
        files: Sequence[LocalFile],
        loc: Location,
        verb: str = "uploaded",
        digest: bool = False,
        algo: str = "sha256",
        staged: bool = False,
    ) -> TransferStats:
        """Upload ``files`` below ``loc`` (each at ``loc/rel``) and log the throughput.
        ``digest``, ``algo``, ``staged``: as ``upload_action``.

        Raises:
            DataError: a file failed for good.
        """
        helper = self.early_helper(
            loc,
            len(files),
            sum(f.size for f in files),
            digest and not any(f.confined for f in files),
        )
        with _ended_on_error(helper):
            join, url = _joiner(loc.root), loc.url.rstrip("/")
            jobs = [
                FileJob(
                    f.rel,
                    str(f.path),
                    join(f.rel),
                    f.size,
                    where=f"{f.path} -> {url}/{f.rel}",
                    confined=f.confined,
                )
                for f in files
            ]
        stats = self.run(jobs, self.upload_action(loc, digest, algo, staged), "upload", loc, helper)
        self.log(stats.summary(verb, f"to {loc.show()}"))
        return stats

    def download_files(
        self,
        files: Sequence[RemoteFile],
        loc: Location,
        dest: Path,
        digests: dict[str, str] | None = None,
    ) -> TransferStats:
        """Download ``files`` of ``loc`` into ``dest`` (each at ``dest/rel``), checking
        ``digests[rel]`` where given, and log the throughput.

        Raises:
            DataError: a file failed for good.
        """
        digests = digests or {}
        helper = self.early_helper(
            loc, len(files), sum(f.size for f in files), len(digests) >= len(files)
        )
        with _ended_on_error(helper):
            for f in files:
                _check_target(dest, f.rel)
            join = _joiner(str(dest))  # strings, not Path objects: per-file cost matters
            url = _file_url if loc.is_local else loc.fs.unstrip_protocol
            jobs = [
                FileJob(
                    f.rel,
                    f.path,
                    target,
                    f.size,
                    digests.get(f.rel),
                    where=f"{url(f.path)} -> {target}",
                )
                for f in files
                for target in (join(f.rel),)
            ]
        stats = self.run(jobs, self.download_action(loc), "download", loc, helper)
        self.log(stats.summary("downloaded", f"from {loc.show()}"))
        return stats


@contextlib.contextmanager
def _ended_on_error(helper: copyworker.Helper | None) -> Iterator[None]:
    """End an early-started copy helper when preparing its transfer fails."""
    try:
        yield
    except BaseException:
        if helper is not None:
            helper.abort()
        raise


def _record(stats: TransferStats, job: FileJob, result: str | Moved | None) -> None:
    """Count one finished job in ``stats``: its digest, and the size moved (``Moved``) or
    listed."""
    digest, size = result if isinstance(result, Moved) else (result, job.size)
    stats.files += 1
    stats.bytes += size
    stats.sizes[job.rel] = size
    if digest:
        stats.digests[job.rel] = digest


def _digest_counted(path: Path, algo: str) -> tuple[str, int]:
    """The hex digest (``storage.new_hasher``) of a local file and the bytes it hashed.
    Raises OSError, DataError."""
    digest, count = storage.new_hasher(algo), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            count += len(chunk)
    return digest.hexdigest(), count


def _joiner(root: str) -> Callable[[str], str]:
    """``join(rel)``: ``root/rel`` as ``posixpath.join(root, rel.strip("/"))`` gives it (what
    ``Location.join`` and ``Path /`` do for a relative ``rel``), by one concatenation where
    ``rel`` needs no stripping: a transfer joins once per file."""
    prefix = root if root.endswith("/") else root + "/"

    def join(rel: str) -> str:
        if not rel:
            return root
        if rel[0] == "/" or rel[-1] == "/":
            return posixpath.join(root, rel.strip("/"))
        return prefix + rel

    return join


def _file_url(path: str) -> str:
    """``file://`` + a local path (what ``LocalFileSystem.unstrip_protocol`` gives for a
    path it listed), for messages."""
    return f"file://{path}"


def _check_target(dest: Path, rel: str) -> None:
    """Refuse a download whose ``rel`` would land outside ``dest`` (absolute, ``..``):
    a crafted listing or manifest must not write elsewhere. Raises DataError."""
    parts = rel.replace("\\", "/").split("/")
    if not rel or os.path.isabs(rel) or rel.startswith("\\") or ".." in parts:
        raise DataError(
            f"refused to download {rel!r}: the path is absolute or leaves {dest} ('..')"
        )


class _ChangedWhileSending(OSError):
    """The local file changed during its upload (not transient)."""


def _stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_mtime_ns, info.st_size


def _cause(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return f"{type(exc).__name__}: {text}"


def _first_error(failed: list[Future[Any]]) -> BaseException:
    error = failed[0].exception()
    assert error is not None
    return error
