"""URL transfers: upload local files to a URL, download a URL, list it (OSMO docs, "Inputs
and Outputs", ``url:``; ``osmo data upload|download|list``).

Uploads are atomic per file (``storage`` module rules): a reader never sees half a file,
but a failed upload leaves the files sent before the failure (the transfer raises, and the
runner fails the task with 2012). Downloads of a URL that holds checkpoint rounds
(``.trainyard/rounds/``) read one committed round (``checkpoints`` module rule); other URLs
are read file by file as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from pathlib import Path

from trainyard.data.checkpoints import has_checkpoint, read_checkpoint
from trainyard.data.storage import RemoteFile
from trainyard.data.transfer import Mover, TransferStats, file_filter, plan_uploads

__all__ = ["upload", "download", "list_url"]


def upload(url: str | PathLike[str], paths: Sequence[str | Path], regex: str | None = None,
           mover: Mover | None = None) -> TransferStats:
    """Upload local files and folders below ``url`` (naming: ``transfer.plan_uploads``).

    Raises:
        DataError: a path is missing, the regex is bad, or a file failed for good (names the
            file and the cause).
    """
    mover = mover or Mover()
    files = plan_uploads(paths, regex)
    return mover.upload_files(files, mover.location(url))


def list_url(url: str | PathLike[str], regex: str | None = None, mover: Mover | None = None) -> list[RemoteFile]:
    """The files at ``url`` whose path relative to it matches ``regex``.

    Raises:
        DataError: ``url`` does not exist or the storage failed.
    """
    mover = mover or Mover()
    keep = file_filter(regex)
    return [f for f in mover.list(mover.location(url)) if keep(f.rel)]


def download(url: str | PathLike[str], dest: Path, regex: str | None = None, mover: Mover | None = None) -> int:
    """Download the files at ``url`` (a folder-like prefix, or one file) into ``dest``.

    Returns:
        The number of files written.

    Raises:
        DataError: ``url`` does not exist, the regex is bad, or a file failed for good.
    """
    mover = mover or Mover()
    loc = mover.location(url)
    keep = file_filter(regex)
    dest.mkdir(parents=True, exist_ok=True)
    if has_checkpoint(mover, loc):
        return read_checkpoint(mover, loc, dest, regex)
    files = [f for f in mover.list(loc) if keep(f.rel)]
    return mover.download_files(files, loc, dest).files
