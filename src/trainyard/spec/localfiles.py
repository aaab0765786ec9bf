"""Read ``files[].localpath`` into ``files[].contents``.

A ``localpath`` is relative to the spec's folder and must stay inside it (no ``..`` and no
symbolic link leading out), name a regular file, and hold UTF-8 text. The files come from
disk, or from a mapping of relative path to contents when the spec travels without its
folder (the server receives the spec text with its files inlined).

Source: OSMO docs, "File injection" ("The file path must be relative to where the spec
resides"; files only, not directories).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI reads local files without the models (a lighter start)
    from trainyard.spec.models import WorkflowSpec
    from trainyard.spec.problems import Issue, Layout

__all__ = ["LocalFiles", "read_local_files"]


class LocalFiles:
    """Where ``localpath`` files come from: the spec's folder on disk, or a mapping.

    Args:
        spec_dir: the folder holding the spec, for reading from disk.
        files: relative path to contents; when given, the disk is not read.
    """

    def __init__(
        self, spec_dir: Path | None = None, files: Mapping[str, str] | None = None
    ) -> None:
        self._dir = spec_dir
        self._files = (
            None if files is None else {posixpath.normpath(k): v for k, v in files.items()}
        )
        self._cache: dict[str, str] = {}

    def read(self, localpath: str) -> str:
        """The contents of ``localpath``.

        Raises:
            ValueError: the path breaks a rule or cannot be read; the message says which.
        """
        if localpath not in self._cache:
            key = _relative_key(localpath)
            self._cache[localpath] = (
                self._read_mapping(key) if self._files is not None else self._read_disk(key)
            )
        return self._cache[localpath]

    def _read_mapping(self, key: str) -> str:
        assert self._files is not None
        if key not in self._files:
            raise ValueError(
                f"localpath {key!r} was not sent with the spec; include it in the "
                "files (the trainyard CLI sends them when the spec's text names "
                "localpath itself, not when a template builds the word)"
            )
        return self._files[key]

    def _read_disk(self, key: str) -> str:
        if self._dir is None:
            raise ValueError("localpath needs the spec's folder; load the spec from its file")
        base = self._dir.resolve()
        target = (base / key).resolve()
        if not target.is_relative_to(base):
            raise ValueError(
                f"localpath {key!r} leads outside the spec's folder through a "
                "symbolic link; copy the file into the spec's folder"
            )
        if not target.is_file():
            what = "is a folder" if target.is_dir() else "does not exist"
            raise ValueError(f"localpath {key!r} {what} in {base}; name a file next to the spec")
        return _read_text(target, key)


def _relative_key(localpath: str) -> str:
    if localpath.startswith("/") or Path(localpath).is_absolute():
        raise ValueError(
            f"localpath {localpath!r} is absolute; give it relative to the spec's folder"
        )
    key = posixpath.normpath(localpath)
    if key == ".." or key.startswith("../"):
        raise ValueError(
            f"localpath {localpath!r} leads outside the spec's folder; "
            "copy the file next to the spec"
        )
    return key


def _read_text(path: Path, key: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"localpath {key!r} is not UTF-8 text; only text files can be injected"
        ) from None
    except OSError as exc:
        raise ValueError(
            f"localpath {key!r} cannot be read: {exc.strerror}; check its permissions"
        ) from None


def read_local_files(workflow: WorkflowSpec, layout: Layout, source: LocalFiles) -> list[Issue]:
    """Fill ``contents`` of every ``localpath`` file of ``workflow`` (in place).

    Returns:
        An issue for each file that gives both ``contents`` and ``localpath``, or whose
        ``localpath`` cannot be used.
    """
    from trainyard.spec.checks import located_tasks
    from trainyard.spec.problems import Issue

    issues = []
    for located in located_tasks(workflow, layout):
        for i, spec in enumerate(located.task.files):
            if spec.localpath is None:
                continue
            loc = located.loc + ("files", i)
            if spec.contents is not None:
                issues.append(Issue(loc, "give contents or localpath, not both"))
                continue
            try:
                spec.contents = source.read(spec.localpath)
            except ValueError as exc:
                issues.append(Issue(loc + ("localpath",), str(exc)))
    return issues
