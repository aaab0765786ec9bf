"""Moving a task's data: inputs in, outputs and checkpoints out (the runner's data hook).

The built-in hook copies ``task:`` inputs as plain files and moves ``url:`` data through
fsspec (``file://`` always; ``s3://`` and others when their fsspec package is installed).
Datasets need the data layer: if ``trainyard.data`` offers ``runner_hook()`` returning a
``DataHook``, the runner uses that instead (it may subclass ``FsspecData``).

Every upload is atomic per file: the bytes go to ``<name>.trainyard-partial-<random>`` next to
the target and are then renamed (moved) onto it, so a reader never takes a half-written file
for a complete one. Regexes select files by their path relative to the source (``re.search``).
"""

from __future__ import annotations

import importlib
import posixpath
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from trainyard.errors import DataError
from trainyard.linux.safefs import files_inside, no_links_path
from trainyard.runfile import RunInput, RunOutput

__all__ = ["DataHook", "FsspecData", "UploadState", "load_data_hook", "file_filter"]

UploadState = dict[str, tuple[int, int]]
"""Relative path -> (mtime_ns, size) of what was last uploaded; lets uploads skip unchanged files."""


class DataHook(Protocol):
    """How the runner moves data. Methods raise ``DataError`` on failure."""

    def download(self, item: RunInput, dest: Path) -> int:
        """Fetch ``item`` into the folder ``dest``; returns the number of files."""

    def upload(self, src: Path, target: RunOutput) -> int:
        """Upload the files of folder ``src`` to ``target``; returns the number of files."""

    def sync(self, src: Path, url: str, regex: str | None, state: UploadState) -> int:
        """Upload files of ``src`` (file or folder) changed since ``state`` to ``url``."""


def file_filter(regex: str | None) -> Callable[[str], bool]:
    """A predicate on relative paths: ``re.search(regex, path)``; everything if no regex.

    Raises:
        DataError: the regex does not compile.
    """
    if not regex:
        return lambda _path: True
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        raise DataError(f"bad regex {regex!r}: {exc}") from exc
    return lambda path: pattern.search(path) is not None


def _local_files(src: Path) -> list[tuple[Path, str]]:
    """(real path, relative posix path) of every file below ``src`` (or ``src`` itself), a
    folder a task wrote: no symlink out of it is followed (``safefs.files_inside``; a link
    skipped is logged by the runner's data hook of the data layer, silently here)."""
    return files_inside(src)


class FsspecData:
    """The built-in data hook: plain copies for ``task:`` inputs, fsspec for URLs."""

    def download(self, item: RunInput, dest: Path) -> int:
        dest.mkdir(parents=True, exist_ok=True)
        keep = file_filter(item.regex)
        if item.kind == "task":
            return self._copy_folder(Path(item.source), dest, keep)
        if item.kind == "url":
            return self._fetch_url(item.source, dest, keep)
        raise DataError(
            f"dataset input {item.name!r}: datasets need the data layer "
            "(trainyard.data.runner_hook), which is not available"
        )

    def upload(self, src: Path, target: RunOutput) -> int:
        if target.url is None:
            name = target.dataset.name if target.dataset else "?"
            raise DataError(
                f"dataset output {name!r}: datasets need the data layer "
                "(trainyard.data.runner_hook), which is not available"
            )
        return self.sync(src, target.url, target.regex, {})

    def sync(self, src: Path, url: str, regex: str | None, state: UploadState) -> int:
        keep = file_filter(regex)
        fs, root = self._fs(url)
        count = 0
        for path, rel in _local_files(src) if src.exists() else []:
            if not keep(rel):
                continue
            stamp = self._stamp(path)
            if stamp is None or state.get(rel) == stamp:
                continue
            self._put_atomic(fs, path, posixpath.join(root, rel))
            state[rel] = stamp
            count += 1
        return count

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int] | None:
        try:
            info = path.stat()
        except FileNotFoundError:  # deleted while we walked
            return None
        return info.st_mtime_ns, info.st_size

    @staticmethod
    def _fs(url: str) -> tuple[Any, str]:
        try:
            from fsspec.core import url_to_fs  # imported on use: most tasks move no URLs

            fs, root = url_to_fs(url)
        except (ValueError, ImportError) as exc:
            raise DataError(f"{url}: no way to reach it: {exc}") from exc
        return fs, root.rstrip("/") or "/"

    @staticmethod
    def _put_atomic(fs: Any, path: Path, target: str) -> None:
        partial = f"{target}.trainyard-partial-{uuid.uuid4().hex[:8]}"
        try:
            fs.makedirs(posixpath.dirname(target), exist_ok=True)
            with no_links_path(path) as opened:  # the file listed, never a link
                fs.put_file(opened, partial)
            fs.mv(partial, target)
        except (OSError, ValueError) as exc:
            raise DataError(f"upload of {path} to {target} failed: {exc}") from exc

    @staticmethod
    def _copy_folder(src: Path, dest: Path, keep: Callable[[str], bool]) -> int:
        if not src.is_dir():
            raise DataError(f"upstream output folder {src} does not exist")
        count = 0
        try:
            for path, rel in _local_files(src):
                if keep(rel):
                    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                    with no_links_path(path) as opened:  # never a link the task made
                        shutil.copy2(opened, dest / rel)
                    count += 1
        except OSError as exc:
            raise DataError(f"copying {src} to {dest} failed: {exc}") from exc
        return count

    def _fetch_url(self, url: str, dest: Path, keep: Callable[[str], bool]) -> int:
        fs, root = self._fs(url)
        try:
            if not fs.exists(root):  # an empty input, as the data layer's hook has it
                return 0
            files = [root] if fs.isfile(root) else sorted(fs.find(root))
            chosen = [(f, self._relative(f, root)) for f in files]
            chosen = [(f, rel) for f, rel in chosen if keep(rel)]
            for remote, rel in chosen:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                fs.get_file(remote, str(dest / rel))
        except (OSError, ValueError) as exc:
            raise DataError(f"download of {url} failed: {exc}") from exc
        return len(chosen)

    @staticmethod
    def _relative(path: str, root: str) -> str:
        rel = posixpath.relpath(path, root)
        return posixpath.basename(path) if rel in (".", "") else rel


def load_data_hook(log: Callable[[str], None] | None = None) -> DataHook:
    """The data layer's hook (``trainyard.data.runner_hook(log)``) if it has one, else ours.

    Args:
        log: where the hook writes its own lines (retries, throughput): the task log.
    """
    try:
        module = importlib.import_module("trainyard.data")
    except ImportError:
        return FsspecData()
    factory = getattr(module, "runner_hook", None)
    return factory(log) if callable(factory) else FsspecData()
