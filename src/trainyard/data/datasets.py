"""Datasets (OSMO docs, "Working with Data" / ``osmo dataset``): named sets of files with
numbered versions and tags, kept under one store URL (``DataConfig.dataset_url``: by default
``file://$TRAINYARD_HOME/datasets``, or a bucket such as ``s3://team-bucket/datasets``).
``DatasetStore`` reads and writes them; who may do what is ``data.datasetaccess``. A version
exists exactly when its manifest does (created last, exclusively); downloads check every
file's size and digest. Layout and rules: docs/data.md "The dataset store".
"""

from __future__ import annotations

import functools
import json
import posixpath
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

from trainyard.data import storage
from trainyard.data.datasetaccess import (
    EVERYONE,
    Actor,
    DatasetAccess,
    check_name,
    read_if_there,
    valid_name,
)
from trainyard.data.storage import Location, RemoteFile
from trainyard.data.transfer import (
    LocalFile,
    Mover,
    TransferStats,
    fast_digest_algo,
    file_filter,
    split_digest,
)
from trainyard.data.transfer import _joiner as joiner
from trainyard.errors import DataError, NotFoundError

__all__ = [
    "Actor",
    "DatasetFile",
    "DatasetVersion",
    "DatasetInfo",
    "DatasetStore",
    "parse_ref",
    "LATEST",
    "EVERYONE",
]

LATEST = "latest"


_MAX_COMMIT_TRIES = 100


class DatasetFile(BaseModel):
    """One file of a version: its path inside the dataset, size in bytes, and its digest:
    ``blake3`` (hex; versions written since BLAKE3 is used, when the package is installed)
    or ``sha256`` (hex; older versions, or without the package). At least one is set."""

    path: str
    size: int
    sha256: str | None = None
    blake3: str | None = None

    @model_validator(mode="after")
    def _one_digest(self) -> DatasetFile:
        if self.sha256 is None and self.blake3 is None:
            raise ValueError(f"file {self.path!r} has no digest (sha256 or blake3)")
        return self

    @property
    def digest(self) -> str:
        """The digest a download checks, in ``transfer.tag_digest`` form."""
        return f"blake3:{self.blake3}" if self.blake3 else str(self.sha256)

    @classmethod
    def of(cls, path: str, size: int, digest: str) -> DatasetFile:
        """From a ``tag_digest``-form digest (what an upload returns)."""
        algo, value = split_digest(digest)
        return cls(path=path, size=size, **{algo: value})


class DatasetVersion(BaseModel):
    """A complete version (its manifest)."""

    name: str
    version: int
    upload_id: str
    created_s: float
    files: list[DatasetFile]

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class DatasetInfo:
    """A dataset's complete versions (oldest first) and its tags (``latest`` included)."""

    name: str
    versions: list[DatasetVersion]
    tags: dict[str, int] = field(default_factory=dict)

    def tags_of(self, version: int) -> list[str]:
        return sorted(t for t, v in self.tags.items() if v == version)


def check_inside(version: DatasetVersion) -> DatasetVersion:
    """``version`` if every file path of its manifest is relative and stays inside the
    dataset: not absolute, no ``..`` part, no NUL (a manifest crafted in the store must not
    make a download write outside its folder, nor read outside the dataset).

    Raises:
        DataError: names the version and the path.
    """
    for item in version.files:
        rel = item.path
        parts = rel.replace("\\", "/").split("/")
        if not rel or rel.startswith(("/", "\\")) or ".." in parts or "\0" in rel:
            raise DataError(
                f"dataset {version.name} version {version.version}: file path "
                f"{rel!r} is absolute or leaves the dataset ('..'); this manifest "
                "was not written by trainyard: refused"
            )
    return version


def check_tag(tag: str) -> str:
    """A tag a user may set: a valid name, not all digits (those are versions), not ``latest``."""
    check_name(tag, "tag")
    if tag.isdigit() or tag == LATEST:
        raise DataError(
            f"bad tag {tag!r}: a tag is not a number and not {LATEST!r} "
            "(latest always means the newest complete version)"
        )
    return tag


def parse_ref(ref: str) -> tuple[str, str]:
    """``name[:version|:tag]`` -> (name, selector); the selector defaults to ``latest``.

    Raises:
        DataError: the name or selector is malformed.
    """
    name, _, selector = ref.partition(":")
    check_name(name)
    selector = selector or LATEST
    if not selector.isdigit():
        check_name(selector, "tag")
    return name, selector


def _number(name: str, suffix: str) -> int | None:
    stem = posixpath.basename(name)
    if not stem.endswith(suffix):
        return None
    digits = stem[: -len(suffix)]
    return int(digits) if digits.isdigit() else None


class DatasetStore:
    """The datasets under one store URL.

    Args:
        url: the store root (default ``mover.config.dataset_url``).
        mover: moves the bytes (default: a ``Mover`` with the current settings).
    """

    def __init__(
        self, url: str | None = None, mover: Mover | None = None, actor: Actor | None = None
    ) -> None:
        self.mover = mover or Mover()
        self.url = url or self.mover.config.dataset_url
        self.loc: Location = self.mover.location(self.url)
        self.actor = actor
        self.access = DatasetAccess(self.loc, self.mover, actor)
        """Who owns and may read each dataset (``data.datasetaccess``)."""

    # ------------------------------------------------------------------ ownership

    def check_may_write(self, name: str) -> None:
        """Raise ForbiddenError unless the actor may add versions to ``name`` (its owner, an
        admin, or nobody owns it yet)."""
        self.access.check_write(check_name(name), "add a version to")

    def share(self, name: str, user: str, *, remove: bool = False) -> dict[str, Any]:
        """Let ``user`` (or ``EVERYONE``) read ``name``, or stop that with ``remove``.
        A dataset without an owner becomes the actor's. Returns the new ``owner.json``.

        Raises:
            NotFoundError: no such dataset. ForbiddenError: not the owner nor an admin.
        """
        if not self.versions(name):
            raise NotFoundError(f"no dataset {name!r} in {self.loc.show()}")
        return self.access.share(name, user, remove=remove)

    # ------------------------------------------------------------------ reading

    def names(self) -> list[str]:
        """Datasets with at least one complete version, sorted. Raises DataError."""
        found = [n for n in self._children("") if valid_name(n) and self._numbers(n, ".json")]
        return [n for n in found if self.access.readable(n)]

    def versions(self, name: str) -> list[DatasetVersion]:
        """Complete versions of ``name``, oldest first (empty if none). Raises DataError."""
        found = [self._manifest(name, n) for n in self._numbers(check_name(name), ".json")]
        return [v for v in found if v is not None]

    def info(self, name: str) -> DatasetInfo:
        """Versions and tags of ``name``.

        Raises:
            NotFoundError: no complete version of ``name``.
            DataError: the store failed.
        """
        versions = self.versions(name)
        if not versions:
            raise NotFoundError(f"no dataset {name!r} in {self.loc.show()}")
        self.access.check_read(name)
        known = {v.version for v in versions}
        tags = {t: v for t, v in self._tags(name).items() if v in known}
        tags[LATEST] = versions[-1].version
        return DatasetInfo(name, versions, tags)

    def resolve(self, ref: str) -> DatasetVersion:
        """The version ``name[:version|:tag]`` names (``latest`` by default).

        Raises:
            NotFoundError: no such dataset, version or tag (lists what exists).
            DataError: malformed reference, or the store failed.
        """
        name, selector = parse_ref(ref)
        info = self.info(name)
        number = int(selector) if selector.isdigit() else info.tags.get(selector)
        chosen = [v for v in info.versions if v.version == number]
        if not chosen:
            have = ", ".join([str(v.version) for v in info.versions] + sorted(info.tags))
            raise NotFoundError(
                f"dataset {name!r} has no version or tag {selector!r} (has: {have})"
            )
        return chosen[0]

    # ------------------------------------------------------------------ writing

    def upload(self, name: str, files: list[LocalFile], tag: str | None = None) -> DatasetVersion:
        """Upload ``files`` as a new version of ``name`` (module rules), optionally tagged.

        Returns:
            The new version.

        Raises:
            DataError: a file failed (names it and the cause): no version was created.
        """
        check_name(name)
        if tag is not None:
            check_tag(tag)
        self.access.check_write(name, "add a version to")
        self.access.claim(name)
        self.access.check_write(name, "add a version to")  # another creator may have won
        upload_id = f"{int(time.time())}-{uuid.uuid4().hex[:12]}"
        stage = self.loc.child(f"{name}/data/{upload_id}")
        try:
            stats = self.mover.upload_files(
                files,
                stage,
                verb=f"dataset {name}: uploaded",
                digest=True,
                algo=fast_digest_algo(),
                staged=True,
            )
        except DataError:
            self._discard(stage)
            raise
        version = self._commit(name, upload_id, files, stats)
        if tag is not None:
            self.tag(name, str(version.version), tag)
        self.mover.log(
            f"dataset {name} version {version.version} created "
            f"({len(files)} file(s)) in {self.loc.show()}"
        )
        return version

    def download(
        self, ref: str, dest: Path, path: str | None = None, regex: str | None = None
    ) -> tuple[DatasetVersion, TransferStats]:
        """Download version ``ref`` into ``dest``, checking sha256.

        Args:
            ref: ``name[:version|:tag]``.
            dest: the local folder (created).
            path: a file or folder inside the dataset; files land relative to it.
            regex: only files whose path (relative to ``path``) matches.

        Raises:
            NotFoundError: no such dataset, version, tag or path.
            DataError: a transfer failed for good (names the file and the cause).
        """
        version = check_inside(self.resolve(ref))
        chosen = _select(version, path, file_filter(regex))
        join = joiner(self.loc.join(version.name, "data", version.upload_id))  # per file: cheap
        remote = [RemoteFile(join(f.path), rel, f.size) for rel, f in chosen]
        dest.mkdir(parents=True, exist_ok=True)
        stats = self.mover.download_files(
            remote, self.loc, dest, {rel: f.digest for rel, f in chosen}
        )
        return version, stats

    def tag(self, name: str, selector: str, tag: str) -> DatasetVersion:
        """Point ``tag`` at version ``selector`` (a number or another tag) of ``name``.

        Raises:
            NotFoundError: no such version. DataError: bad tag, or the store failed.
        """
        check_tag(tag)
        version = self.resolve(f"{name}:{selector}")
        self.access.check_write(name, "tag")
        path = self.loc.join(name, "tags", f"{tag}.json")
        data = json.dumps({"version": version.version}).encode()
        self.mover.storage_call(
            f"writing tag {name}:{tag}", lambda: storage.write_bytes(self.loc, path, data)
        )
        return version

    def delete(self, name: str, selector: str | None = None) -> list[int]:
        """Delete one version (``selector``: number or tag) or, without one, the whole dataset.

        Returns:
            The version numbers deleted.

        Raises:
            NotFoundError: no such dataset or version. DataError: the store failed.
        """
        info = self.info(name)
        self.access.check_write(name, "delete")
        doomed = [self.resolve(f"{name}:{selector}")] if selector else info.versions
        for version in doomed:
            self._delete_version(version, info)
        if not selector:
            self.mover.storage_call(
                f"deleting dataset {name}",
                lambda: storage.remove(self.loc, self.loc.join(name), recursive=True),
            )
        return [v.version for v in doomed]

    # ------------------------------------------------------------------ internals

    def _commit(
        self, name: str, upload_id: str, files: list[LocalFile], stats: TransferStats
    ) -> DatasetVersion:
        entries = [DatasetFile.of(f.rel, stats.sizes[f.rel], stats.digests[f.rel]) for f in files]
        for _try in range(_MAX_COMMIT_TRIES):
            number = max([0, *self._numbers(name, ".json"), *self._numbers(name, ".deleted")]) + 1
            version = DatasetVersion(
                name=name, version=number, upload_id=upload_id, created_s=time.time(), files=entries
            )
            if self._create_manifest(version):
                return version
        raise DataError(
            f"dataset {name}: could not claim a version number after "
            f"{_MAX_COMMIT_TRIES} tries (too many concurrent writers?)"
        )

    def _create_manifest(self, version: DatasetVersion) -> bool:
        path = self._manifest_path(version.name, version.version)
        data = version.model_dump_json(exclude_none=True, indent=1).encode()  # 6x json.dumps
        created = self.mover.storage_call(
            f"creating {self.loc.show(f'{version.name}/versions/{version.version}.json')}",
            lambda: storage.create_exclusive(self.loc, path, data),
        )
        if created:
            return True
        theirs = self._manifest(version.name, version.version)  # ours, if a retry re-sent it
        return theirs is not None and theirs.upload_id == version.upload_id

    def _read_if_there(self, what: str, path: str) -> bytes | None:
        """The bytes of ``path`` in the store, None when it does not exist (``read_if_there``)."""
        return read_if_there(self.mover, self.loc, what, path)

    def _manifest_path(self, name: str, number: int) -> str:
        return self.loc.join(name, "versions", f"{number}.json")

    def _manifest(self, name: str, number: int) -> DatasetVersion | None:
        path = self._manifest_path(name, number)
        raw = read_if_there(self.mover, self.loc, f"reading {name} version {number}", path)
        if raw is None:
            return None
        try:
            return DatasetVersion.model_validate_json(raw)
        except ValidationError as exc:
            raise DataError(
                f"{self.loc.show(f'{name}/versions/{number}.json')}: not a dataset manifest: {exc}"
            ) from exc

    def _children(self, rel: str) -> list[str]:
        folder = self.loc.join(rel) if rel else self.loc.root

        def listing() -> list[str]:
            self.loc.fs.invalidate_cache()
            try:
                return [
                    posixpath.basename(p.rstrip("/")) for p in self.loc.fs.ls(folder, detail=False)
                ]
            except FileNotFoundError:
                return []

        return sorted(self.mover.storage_call(f"listing {self.loc.show(rel)}", listing))

    def _numbers(self, name: str, suffix: str) -> list[int]:
        found = (_number(child, suffix) for child in self._children(f"{name}/versions"))
        return sorted(n for n in found if n is not None)

    def _tags(self, name: str) -> dict[str, int]:
        tags = {}
        for child in self._children(f"{name}/tags"):
            if child.endswith(".json"):
                path = self.loc.join(name, "tags", child)
                try:
                    raw = self.mover.storage_call(
                        f"reading tag {child}",
                        functools.partial(storage.read_bytes, self.loc, path),
                    )
                    tags[child.removesuffix(".json")] = int(json.loads(raw)["version"])
                except (DataError, ValueError, KeyError, TypeError):
                    continue  # deleted meanwhile or not ours: not a tag
        return tags

    def _delete_version(self, version: DatasetVersion, info: DatasetInfo) -> None:
        name, number = version.name, version.version
        tomb = self.loc.join(name, "versions", f"{number}.deleted")

        def tombstone() -> None:
            storage.write_bytes(self.loc, tomb, b"{}")
            storage.remove(self.loc, self._manifest_path(name, number))

        self.mover.storage_call(f"deleting {name} version {number}", tombstone)
        self._discard(self.loc.child(f"{name}/data/{version.upload_id}"))
        for tag in info.tags_of(number):
            if tag != LATEST:
                path = self.loc.join(name, "tags", f"{tag}.json")
                self.mover.storage_call(
                    f"deleting tag {name}:{tag}", functools.partial(storage.remove, self.loc, path)
                )

    def _discard(self, loc: Location) -> None:
        """Best effort: remove an unreferenced upload folder (leftovers are harmless)."""
        try:
            storage.remove(loc, loc.root, recursive=True)
        except Exception as exc:  # noqa: BLE001 - the store may be the thing that failed
            self.mover.log(f"could not remove {loc.show()}: {type(exc).__name__}: {exc}")


def _select(
    version: DatasetVersion, path: str | None, keep: Callable[[str], bool]
) -> list[tuple[str, DatasetFile]]:
    """(path relative to ``path``, file) of the files below ``path`` that ``keep`` accepts."""
    base = (path or "").strip("/")
    chosen = []
    for item in version.files:
        if not base:
            rel = item.path
        elif item.path == base:
            rel = posixpath.basename(item.path)
        elif item.path.startswith(base + "/"):
            rel = item.path[len(base) + 1 :]
        else:
            continue
        if keep(rel):
            chosen.append((rel, item))
    if (
        base
        and not chosen
        and not any(f.path == base or f.path.startswith(base + "/") for f in version.files)
    ):
        raise NotFoundError(
            f"dataset {version.name} version {version.version} has no path {base!r}"
        )
    return chosen
