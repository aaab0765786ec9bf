"""Checkpoints (OSMO docs, "Checkpointing"): a task folder uploaded to a URL every
``frequency`` and once more at the end, in rounds that readers see whole or not at all.

Below the URL: the files at ``<url>/<rel>``, round n's manifest (size, sha256, round of each
file) at ``<url>/.trainyard/rounds/<n>.json``, staged files at
``<url>/.trainyard/staging/<n>/<rel>``. A round uploads what changed to staging, commits by
creating its manifest exclusively, publishes (rename, or copy+delete on S3), then removes older
manifests and staging folders. Readers (``read_checkpoint``, every ``url:`` download) take the
newest manifest and check each file's sha256, falling back to staging, then starting over: they
get exactly one committed round, never a mix. The rule step by step: docs/data.md,
"Checkpoint rounds".
"""

from __future__ import annotations

import functools
import json
import posixpath
import time
from dataclasses import dataclass
from pathlib import Path

from fsspec.callbacks import Callback
from pydantic import BaseModel, ValidationError

from trainyard.data import storage
from trainyard.data.retry import ChecksumMismatch
from trainyard.data.storage import META_DIR, Location
from trainyard.data.transfer import (
    FileJob,
    JobAction,
    LocalFile,
    Moved,
    Mover,
    file_filter,
    local_files,
)
from trainyard.errors import DataError

__all__ = [
    "CheckpointEntry",
    "CheckpointManifest",
    "CheckpointWriter",
    "read_checkpoint",
    "has_checkpoint",
    "UploadState",
]

UploadState = dict[str, tuple[int, int]]
"""Relative path -> (mtime_ns, size) of what the last committed round holds."""

ROUNDS = f"{META_DIR}/rounds"
STAGING = f"{META_DIR}/staging"
_READ_ATTEMPTS = 5


class CheckpointEntry(BaseModel):
    """One file of a checkpoint round."""

    path: str
    size: int
    sha256: str
    round: int


class CheckpointManifest(BaseModel):
    """A committed round: the whole set of files."""

    round: int
    created_s: float
    files: list[CheckpointEntry]


def _round_of(name: str) -> int | None:
    stem = posixpath.basename(name).removesuffix(".json")
    return int(stem) if name.endswith(".json") and stem.isdigit() else None


def _rounds(mover: Mover, loc: Location) -> list[int]:
    folder = loc.join(ROUNDS)

    def listing() -> list[int]:
        loc.fs.invalidate_cache()
        try:
            if not loc.fs.exists(folder):
                return []
            return sorted(
                n for n in map(_round_of, loc.fs.ls(folder, detail=False)) if n is not None
            )
        except OSError as exc:  # its text without the internal path (said as the URL)
            if not exc.errno:
                raise
            raise type(exc)(exc.errno, exc.strerror) from exc

    # Named by the URL the user wrote, not by the checkpoint folder inside it:
    # this is the first read of every download.
    return mover.storage_call(f"reading {loc.show()}", listing)


def has_checkpoint(mover: Mover, loc: Location) -> bool:
    """Whether ``loc`` holds committed checkpoint rounds. Raises DataError."""
    return bool(_rounds(mover, loc))


def _load_manifest(mover: Mover, loc: Location, number: int) -> CheckpointManifest | None:
    path = loc.join(ROUNDS, f"{number}.json")
    try:
        data = mover.storage_call(
            f"reading {loc.show(path)}", lambda: storage.read_bytes(loc, path)
        )
    except DataError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None  # removed by a newer round since we listed
        raise
    try:
        return CheckpointManifest.model_validate_json(data)
    except ValidationError as exc:
        raise DataError(
            f"{loc.show(f'{ROUNDS}/{number}.json')}: not a checkpoint manifest: {exc}"
        ) from exc


def _newest(mover: Mover, loc: Location) -> CheckpointManifest | None:
    """The newest committed round's manifest, None when there is none. When every round
    listed was replaced by a newer one between the listing and the read (a writer that
    commits and prunes quickly), it lists again, a few times, rather than report none."""
    for _attempt in range(_READ_ATTEMPTS):
        numbers = _rounds(mover, loc)
        for number in reversed(numbers):
            manifest = _load_manifest(mover, loc, number)
            if manifest is not None:
                return manifest
        if not numbers:
            return None
    return None


# ---------------------------------------------------------------------------- reading


def read_checkpoint(mover: Mover, loc: Location, dest: Path, regex: str | None) -> int:
    """Download the newest committed round at ``loc`` into ``dest`` (module docstring rule).

    Returns:
        The number of files written (those whose path matches ``regex``).

    Raises:
        DataError: no committed round, or no consistent set after a few tries, or a transfer
            failed for good (names the file and the cause).
    """
    keep = file_filter(regex)
    for _attempt in range(_READ_ATTEMPTS):
        manifest = _newest(mover, loc)
        if manifest is None:
            raise DataError(f"{loc.show()}: no complete checkpoint")
        entries = [e for e in manifest.files if keep(e.path)]
        if _fetch_round(mover, loc, entries, dest):
            mover.log(f"checkpoint round {manifest.round} of {loc.show()}: {len(entries)} file(s)")
            return len(entries)
        mover.log(f"checkpoint round {manifest.round} of {loc.show()} changed while read; again")
        time.sleep(0.2)
    raise DataError(f"{loc.show()}: the checkpoint kept changing while it was read")


def _fetch_round(mover: Mover, loc: Location, entries: list[CheckpointEntry], dest: Path) -> bool:
    jobs = [
        FileJob(
            e.path,
            loc.join(e.path),
            str(dest / e.path),
            e.size,
            e.sha256,
            where=f"{loc.url.rstrip('/')}/{e.path} -> {dest / e.path}",
        )
        for e in entries
    ]
    stats = mover.run(jobs, _read_action(mover, loc, {e.path: e for e in entries}), "download", loc)
    if stats.files != len(entries) or len(stats.digests) != len(entries):
        return False
    mover.log(stats.summary("downloaded", f"from {loc.show()}"))
    return True


def _read_action(mover: Mover, loc: Location, entries: dict[str, CheckpointEntry]) -> JobAction:
    """Published copy first, the round's staged copy second; ``""`` when neither matches."""
    download = mover.download_action(loc)

    def action(job: FileJob, callback: Callback) -> str | Moved | None:
        staged = loc.join(STAGING, str(entries[job.rel].round), job.rel)
        for source in (job.source, staged):
            try:
                return download(
                    FileJob(job.rel, source, job.target, job.size, job.sha256), callback
                )
            except (FileNotFoundError, ChecksumMismatch):
                continue
        return ""

    return action


# ---------------------------------------------------------------------------- writing


@dataclass
class _Round:
    number: int
    uploaded: list[CheckpointEntry]
    kept: list[CheckpointEntry]
    stamps: dict[str, tuple[int, int] | None]


class CheckpointWriter:
    """Uploads one local folder (or file) to one checkpoint URL in committed rounds.

    One writer per (folder, URL); ``upload_round`` is not meant to run twice at once (the
    runner's ``Checkpointer`` serialises its calls).

    Args:
        url: the checkpoint URL.
        mover: moves the bytes (its log gets one line per round).
    """

    def __init__(self, url: str, mover: Mover) -> None:
        self.mover = mover
        self.loc = mover.location(url)
        self.entries: dict[str, CheckpointEntry] = {}

    def upload_round(self, src: Path, regex: str | None, state: UploadState) -> int:
        """Upload what changed since ``state`` as one committed round (module rule).

        Args:
            src: the local folder or file; a missing one uploads nothing.
            regex: only files whose path relative to ``src`` matches.
            state: what the last committed round holds; updated on success.

        Returns:
            The number of files uploaded (0 when nothing changed).

        Raises:
            DataError: the round failed (names the file and the cause); nothing is committed
                unless the manifest was written, and ``state`` then still tells what to resend.
        """
        if not src.exists():
            return 0
        files = local_files(src, file_filter(regex), confined=True, log=self.mover.log)
        changed = [f for f in files if state.get(f.rel) != _stamp_or_none(f.path)]
        gone = set(self.entries) - {f.rel for f in files}
        if not changed and not gone:
            return 0
        done = self._stage(changed, files)
        self._commit(done)
        self._publish(done, state)
        return len(done.uploaded)

    def _stage(self, changed: list[LocalFile], files: list[LocalFile]) -> _Round:
        number = max([0, *_rounds(self.mover, self.loc)]) + 1
        stage = self.loc.child(f"{STAGING}/{number}")
        stamps = {f.rel: _stamp_or_none(f.path) for f in changed}
        stats = self.mover.run(
            [
                FileJob(
                    f.rel,
                    str(f.path),
                    stage.join(f.rel),
                    f.size,
                    where=f"{f.path} -> {stage.url}/{f.rel}",
                    confined=f.confined,
                )
                for f in changed
            ],
            self.mover.upload_action(stage, digest=True),
            "checkpoint",
            stage,
        )
        uploaded = [
            CheckpointEntry(
                path=f.rel,
                size=stats.sizes[f.rel],  # as copied
                sha256=stats.digests[f.rel],
                round=number,
            )
            for f in changed
        ]
        kept = [self.entries[f.rel] for f in files if f.rel not in stamps and f.rel in self.entries]
        return _Round(number, uploaded, kept, stamps)

    def _commit(self, done: _Round) -> None:
        manifest = CheckpointManifest(
            round=done.number,
            created_s=time.time(),
            files=sorted(done.kept + done.uploaded, key=lambda e: e.path),
        )
        path = self.loc.join(ROUNDS, f"{done.number}.json")
        data = json.dumps(manifest.model_dump(), indent=1).encode()
        created = self.mover.storage_call(
            f"committing {self.loc.show(f'{ROUNDS}/{done.number}.json')}",
            lambda: storage.create_exclusive(self.loc, path, data),
        )
        if not created:
            raise DataError(
                f"{self.loc.show()}: round {done.number} was committed by another "
                "writer; two tasks checkpoint to one URL"
            )
        self.entries = {e.path: e for e in manifest.files}

    def _publish(self, done: _Round, state: UploadState) -> None:
        stage = self.loc.join(STAGING, str(done.number))
        for entry in done.uploaded:
            source, target = posixpath.join(stage, entry.path), self.loc.join(entry.path)
            self.mover.storage_call(
                f"publishing {self.loc.show(entry.path)}",
                functools.partial(_move, self.loc, source, target),
            )
            state[entry.path] = done.stamps[entry.path] or (0, 0)
        for gone in set(state) - set(self.entries):
            del state[gone]
        self._clean(done.number)
        self.mover.log(
            f"checkpoint round {done.number}: {len(done.uploaded)} file(s) uploaded, "
            f"{len(self.entries)} in the set, to {self.loc.show()}"
        )

    def _clean(self, number: int) -> None:
        for old in _rounds(self.mover, self.loc):
            if old < number:
                self.mover.storage_call(
                    "removing an old checkpoint manifest",
                    functools.partial(
                        storage.remove, self.loc, self.loc.join(ROUNDS, f"{old}.json")
                    ),
                )
        self.mover.storage_call(
            "removing checkpoint staging",
            lambda: storage.remove(self.loc, self.loc.join(STAGING), recursive=True),
        )


def _move(loc: Location, source: str, target: str) -> None:
    if loc.is_local:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(source).replace(target)
    else:
        loc.fs.mv(source, target)


def _stamp_or_none(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_mtime_ns, info.st_size
