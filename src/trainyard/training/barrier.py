"""A start barrier for the tasks of a group: ``python -m trainyard.training.barrier``, as OSMO's
``osmo_barrier.py`` (cookbook/dnn_training/torchrun_multinode):
``--num_nodes N --rank R --connect HOST [--port P] [--timeout-s S]``.

Rank 0 listens on ``--port`` (default 12344, as OSMO's); every other rank connects (retrying)
and sends its rank as one line. When ranks 1..N-1 are all in, rank 0 answers ``OK`` to all at
once. A duplicate or out-of-range rank fails everyone (``FAILED: <reason>``); a rank that
disconnects before the release is forgotten (it may reconnect). Unlike OSMO's, a timeout
(``--timeout-s``, default 600). Exit codes: 0 released, 1 failed (bad rank, rank 0 reported a
failure, port in use), 2 bad arguments, 3 timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from collections.abc import Callable, Sequence

from trainyard.training.errors import BarrierError, BarrierFailed, BarrierTimeout

__all__ = [
    "DEFAULT_PORT",
    "DEFAULT_TIMEOUT_S",
    "run_barrier",
    "serve_barrier",
    "join_barrier",
    "main",
    "EXIT_RELEASED",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_TIMEOUT",
]

DEFAULT_PORT = 12344  # osmo_barrier.py's default
DEFAULT_TIMEOUT_S = 600.0
RETRY_INTERVAL_S = 1.0
STATUS_INTERVAL_S = 10.0
EXIT_RELEASED, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 0, 1, 2, 3

Log = Callable[[str], None]


def _print(message: str) -> None:
    print(message, flush=True)


def check_arguments(num_nodes: int, rank: int, connect: str | None) -> None:
    """Raise ValueError unless num_nodes >= 1, 0 <= rank < num_nodes, and ranks > 0 have a host."""
    if num_nodes < 1:
        raise ValueError(f"--num_nodes must be at least 1, got {num_nodes}")
    if not 0 <= rank < num_nodes:
        raise ValueError(f"--rank {rank} is out of range: it must lie in [0, {num_nodes - 1}]")
    if rank != 0 and not connect:
        raise ValueError(f"rank {rank} needs --connect HOST (the host of rank 0)")


# ---------------------------------------------------------------------------- rank 0


class _Server:
    """Rank 0's side: collects ranks 1..N-1, then releases or fails them all at once."""

    def __init__(self, num_nodes: int, log: Log) -> None:
        self.num_nodes = num_nodes
        self.log = log
        self.writers: dict[int, asyncio.StreamWriter] = {}
        self.others: list[asyncio.StreamWriter] = []  # connections that never named a valid rank
        self.done = asyncio.Event()
        self.failure: str | None = None

    def missing(self) -> list[int]:
        return [r for r in range(1, self.num_nodes) if r not in self.writers]

    def fail(self, reason: str) -> None:
        if not self.done.is_set():
            self.failure = reason
            self.log(f"barrier failed: {reason}")
            self.done.set()

    def add(self, rank: int, writer: asyncio.StreamWriter) -> bool:
        if not 1 <= rank < self.num_nodes:
            self.fail(f"rank {rank} connected, outside of the range [1, {self.num_nodes - 1}]")
            return False
        if rank in self.writers:
            self.fail(f"more than one node with rank {rank} connected")
            return False
        self.writers[rank] = writer
        self.log(f"rank {rank} connected ({len(self.writers)}/{self.num_nodes - 1})")
        if not self.missing():
            self.done.set()
        return True

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rank: int | None = None
        line = await reader.readline()
        try:
            rank = int(line.decode("utf-8", "replace").strip())
        except ValueError:
            self.others.append(writer)
            self.fail(f"a peer sent {line[:40]!r} instead of its rank")
            return
        if not self.add(rank, writer):
            self.others.append(writer)
            return
        await reader.read(1)  # returns at EOF: the peer went away (or sent junk)
        if not self.done.is_set() and self.writers.get(rank) is writer:
            del self.writers[rank]
            self.log(f"rank {rank} disconnected before the release; waiting for it again")

    async def answer_all(self) -> None:
        message = ("OK\n" if self.failure is None else f"FAILED: {self.failure}\n").encode()
        writers = list(self.writers.values()) + self.others
        for writer in writers:
            writer.write(message)
        for writer in writers:
            try:
                await writer.drain()
                writer.close()
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

    async def status(self) -> None:
        while True:
            await asyncio.sleep(STATUS_INTERVAL_S)
            missing = ", ".join(str(r) for r in self.missing())
            self.log(
                f"{len(self.writers)}/{self.num_nodes - 1} ranks connected, waiting on ranks: {missing}"
            )


async def _serve(num_nodes: int, port: int, timeout_s: float, listen_host: str, log: Log) -> None:
    state = _Server(num_nodes, log)
    try:
        server = await asyncio.start_server(
            state.handle, host=listen_host, port=port, reuse_address=True
        )
    except OSError as exc:
        raise BarrierFailed(
            f"rank 0 cannot listen on {listen_host}:{port}: {exc.strerror or exc}"
        ) from exc
    log(f"rank 0 listening on {listen_host}:{port} for {num_nodes - 1} rank(s)")
    if num_nodes == 1:
        state.done.set()
    status = asyncio.ensure_future(state.status())
    try:
        await asyncio.wait_for(state.done.wait(), timeout=timeout_s)
    except TimeoutError:
        missing = ", ".join(str(r) for r in state.missing())
        state.failure = f"timed out after {timeout_s:g} s waiting on ranks: {missing}"
        await state.answer_all()
        raise BarrierTimeout(state.failure) from None
    finally:
        status.cancel()
        server.close()
    await state.answer_all()
    if state.failure is not None:
        raise BarrierFailed(state.failure)


def serve_barrier(
    num_nodes: int,
    port: int = DEFAULT_PORT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    listen_host: str = "0.0.0.0",
    log: Log = _print,
) -> None:
    """Rank 0: wait for ranks 1..num_nodes-1, then release them all.

    Raises:
        BarrierFailed: a duplicate or out-of-range rank connected, or the port is taken.
        BarrierTimeout: not every rank connected within ``timeout_s``.
    """
    asyncio.run(_serve(num_nodes, port, timeout_s, listen_host, log))


# ---------------------------------------------------------------------------- ranks > 0


def _connect(host: str, port: int, deadline: float, log: Log) -> socket.socket:
    attempt = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BarrierTimeout(f"could not reach rank 0 at {host}:{port} in time")
        try:
            return socket.create_connection((host, port), timeout=min(remaining, 10.0))
        except OSError as exc:  # refused, unknown host (not yet resolvable), timed out
            attempt += 1
            if attempt == 1 or attempt % 10 == 0:
                log(f"connection to rank 0 at {host}:{port} failed ({exc}); retrying")
            time.sleep(min(RETRY_INTERVAL_S, max(deadline - time.monotonic(), 0)))


def join_barrier(
    rank: int,
    host: str,
    port: int = DEFAULT_PORT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    log: Log = _print,
) -> None:
    """A rank > 0: connect to rank 0 (retrying), announce ``rank``, wait for the release.

    Raises:
        BarrierFailed: rank 0 reported a failure or closed without releasing.
        BarrierTimeout: rank 0 unreachable, or no release, within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    with _connect(host, port, deadline, log) as sock:
        log(f"rank {rank} connected to rank 0 at {host}:{port}")
        sock.sendall(f"{rank}\n".encode())
        answer = b""
        while b"\n" not in answer:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                raise BarrierTimeout(
                    f"rank {rank} was not released within {timeout_s:g} s"
                ) from None
            except OSError as exc:
                raise BarrierFailed(f"lost the connection to rank 0: {exc}") from exc
            if not chunk:
                break
            answer += chunk
    text = answer.decode("utf-8", "replace").strip()
    if text == "OK":
        return
    if text.startswith("FAILED"):
        raise BarrierFailed(text.partition(":")[2].strip() or text)
    raise BarrierFailed(f"rank 0 closed the connection without releasing rank {rank}")


def run_barrier(
    num_nodes: int,
    rank: int,
    connect: str | None = None,
    port: int = DEFAULT_PORT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    listen_host: str = "0.0.0.0",
    log: Log = _print,
) -> None:
    """Block until all ``num_nodes`` ranks have arrived (rank 0 serves, the others join).

    Raises:
        ValueError: bad arguments (rank out of range, no host for a rank > 0).
        BarrierFailed, BarrierTimeout: see :func:`serve_barrier` and :func:`join_barrier`.
    """
    check_arguments(num_nodes, rank, connect)
    if rank == 0:
        serve_barrier(num_nodes, port, timeout_s, listen_host, log)
    else:
        join_barrier(rank, connect or "", port, timeout_s, log)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainyard.training.barrier",
        description="Synchronise the tasks of a group: all ranks are released together.",
    )
    parser.add_argument(
        "--num_nodes", "--num-nodes", type=int, required=True, help="number of ranks"
    )
    parser.add_argument("--rank", type=int, required=True, help="this task's rank, 0..num_nodes-1")
    parser.add_argument("--connect", help="host of rank 0 (required for ranks > 0)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"rank 0's port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--timeout-s",
        "--timeout_s",
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"give up after this many seconds (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument("--listen-host", default="0.0.0.0", help="address rank 0 listens on")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code (0 released, 1 failed, 2 usage, 3 timeout)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        run_barrier(
            args.num_nodes, args.rank, args.connect, args.port, args.timeout_s, args.listen_host
        )
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BarrierTimeout as exc:
        print(f"barrier timeout (rank {args.rank}): {exc}", file=sys.stderr, flush=True)
        return EXIT_TIMEOUT
    except BarrierError as exc:
        print(f"barrier failed (rank {args.rank}): {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    print(f"rank {args.rank}: all {args.num_nodes} ranks arrived, released", flush=True)
    return EXIT_RELEASED


if __name__ == "__main__":
    sys.exit(main())
