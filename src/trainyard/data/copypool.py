"""Many small local files copied and hashed by a ``concurrent.futures.ProcessPoolExecutor``.

A dataset of many small files costs per file, and that cost holds the GIL: threads only
fight over it, processes run side by side. ``copy_orders`` sends chunks of ``CHUNK_FILES``
orders to a pool of ``usable_cpus()`` processes (the ``forkserver`` start method: no fork
of a threaded server) that copy each with ``localcopy.copy_file``, under the same rules as
this process's own copies. Only where it pays (``pays``); ``transfer.Mover`` adds its own
conditions. Lost chunks (a dead worker, an unusable answer) are the caller's to redo.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import NamedTuple

from trainyard.data import localcopy

__all__ = [
    "CopyOrder",
    "Copied",
    "copy_chunk",
    "copy_orders",
    "pays",
    "usable_cpus",
    "start_pool",
    "MIN_FILES",
    "MAX_FILE_BYTES",
    "CHUNK_FILES",
]

MIN_FILES = 500
"""Fewer files than this are not worth a pool's start."""
MAX_FILE_BYTES = 1024 * 1024
"""Files from this size on are copied in the calling process."""
CHUNK_FILES = 128
"""Files per order sent to a worker (one round trip each)."""


class CopyOrder(NamedTuple):
    """One file: ``localcopy.copy_file(source, target, new(algo), None, temp)``; ``temp``
    None writes ``target`` in place (a staged upload)."""

    source: str
    target: str
    temp: str | None
    algo: str


class Copied(NamedTuple):
    """What a worker copied: size in bytes and hex digest of the bytes written."""

    size: int
    digest: str


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pays(files: int) -> bool:
    """Whether a pool is worth starting for ``files`` files: at least ``MIN_FILES`` and two
    usable CPUs."""
    return files >= MIN_FILES and usable_cpus() >= 2


def _hasher(algo: str) -> localcopy.Hasher:
    if algo == "sha256":
        import hashlib

        return hashlib.sha256()
    if algo == "blake3":
        import blake3

        return blake3.blake3()  # type: ignore[no-any-return]
    raise ValueError(f"unknown digest algorithm {algo!r}")


def copy_chunk(orders: Sequence[CopyOrder]) -> list[Copied | str]:
    """Copy each order (runs in a worker). Returns, in order, ``Copied`` or the error text
    ``ErrorName: message`` (``copy_file`` removed what it wrote); never raises for a file."""
    answers: list[Copied | str] = []
    for order in orders:
        try:
            hasher = _hasher(order.algo)
            size = localcopy.copy_file(order.source, order.target, hasher, None, order.temp)
            answers.append(Copied(size, hasher.hexdigest()))  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which redoes the file
            answers.append(f"{type(exc).__name__}: {exc}")
    return answers


def start_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes started by a forkserver that preloads this module.
    Raises OSError when no process can be started."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return ProcessPoolExecutor(workers, mp_context=context)


def copy_orders(
    pool: ProcessPoolExecutor,
    indices: Sequence[int],
    order_of: Callable[[int], CopyOrder],
    on_answer: Callable[[int, Copied | str], None],
    log: Callable[[str], None],
) -> list[int]:
    """Copy the jobs ``indices`` in ``pool``, ``CHUNK_FILES`` at a time, calling
    ``on_answer(index, Copied or error text)`` here for each file of each chunk done.

    Returns:
        The indices of chunks lost (a dead worker, an error in ``on_answer``): their temp
        files removed, for the caller to redo. Each loss is logged once.
    """
    chunks: dict[Future[list[Copied | str]], list[tuple[int, CopyOrder]]] = {}
    for start in range(0, len(indices), CHUNK_FILES):
        chunk = [(i, order_of(i)) for i in indices[start : start + CHUNK_FILES]]
        chunks[pool.submit(copy_chunk, [order for _i, order in chunk])] = chunk
    lost: list[int] = []
    why = ""
    for future in as_completed(chunks):
        chunk = chunks[future]
        try:
            for (index, _order), answer in zip(chunk, future.result(), strict=True):
                on_answer(index, answer)
        except Exception as exc:  # noqa: BLE001 - any failure: the caller redoes the chunk
            why = why or f"{type(exc).__name__}: {exc}"
            _remove_temps(order for _i, order in chunk)
            lost.extend(index for index, _order in chunk)
    if lost:
        log(f"copy helper process lost ({why}): {len(lost)} file(s) done in this process")
    return sorted(lost)


def _remove_temps(orders: Iterable[CopyOrder]) -> None:
    for order in orders:
        if order.temp is not None:
            try:
                os.unlink(order.temp)
            except FileNotFoundError:
                pass
