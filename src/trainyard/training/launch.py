"""A minimal launcher: one process per slot of this node, without torchrun.

``python -m trainyard.training.launch --offset 2 --size 2 --world_size 4 --master_addr HOST
--master_port 29400 -m trainyard.training.train ...`` starts ``--size`` processes with global
ranks ``offset .. offset+size-1`` of ``--world_size``, each with torchrun's environment
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) and ``TRAINYARD_NODE``; global rank 0 hosts the store. ``-m TARGET`` runs a
module, else a script; later arguments pass unchanged. One failing process stops the others
(SIGTERM, SIGKILL after ``--grace-s``); SIGTERM/SIGINT are passed on. Exit: 0 all exited 0,
the first failing code otherwise, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["LaunchPlan", "build_parser", "plan_from_args", "worker_env", "launch", "main"]

DEFAULT_MASTER_PORT = 29400
POLL_INTERVAL_S = 0.1
EXIT_USAGE = 2


@dataclass(frozen=True)
class LaunchPlan:
    """What to start on this node.

    Attributes:
        offset: global rank of this node's first process.
        size: processes on this node.
        world_size: processes in the whole job.
        master_addr, master_port: where global rank 0 hosts the store.
        command: the command each process runs (python and its arguments).
        node: this node's name for the trainer (``TRAINYARD_NODE``).
    """

    offset: int
    size: int
    world_size: int
    master_addr: str
    master_port: int
    command: tuple[str, ...]
    node: str

    def check(self) -> None:
        """Raise ValueError unless 0 <= offset, 1 <= size, offset + size <= world_size."""
        if self.size < 1:
            raise ValueError(f"--size must be at least 1, got {self.size}")
        if self.offset < 0 or self.offset + self.size > self.world_size:
            raise ValueError(
                f"ranks {self.offset}..{self.offset + self.size - 1} (--offset {self.offset}, "
                f"--size {self.size}) do not fit in --world_size {self.world_size}"
            )
        if not 0 < self.master_port < 65536:
            raise ValueError(f"--master_port must lie in 1..65535, got {self.master_port}")


def worker_env(plan: LaunchPlan, local_rank: int, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of the process with local rank ``local_rank``."""
    env = dict(base)
    env.update(
        RANK=str(plan.offset + local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(plan.world_size),
        LOCAL_WORLD_SIZE=str(plan.size),
        MASTER_ADDR=plan.master_addr,
        MASTER_PORT=str(plan.master_port),
        TRAINYARD_NODE=plan.node,
    )
    if plan.size > 1 and not env.get("OMP_NUM_THREADS"):
        env["OMP_NUM_THREADS"] = "1"  # as torchrun does for several processes per node
    return env


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainyard.training.launch",
        description="Start one process per slot of this node with torchrun's environment.",
    )
    parser.add_argument(
        "--offset", type=int, required=True, help="global rank of this node's first process"
    )
    parser.add_argument("--size", type=int, required=True, help="processes on this node")
    parser.add_argument(
        "--world_size", "--world-size", type=int, required=True, help="processes in the job"
    )
    parser.add_argument(
        "--master_addr",
        "--master-addr",
        default=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        help="host of global rank 0 (default $MASTER_ADDR or 127.0.0.1)",
    )
    parser.add_argument(
        "--master_port",
        "--master-port",
        type=int,
        default=int(os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)),
        help=f"port of global rank 0's store (default $MASTER_PORT or {DEFAULT_MASTER_PORT})",
    )
    parser.add_argument(
        "--grace-s", type=float, default=10.0, help="SIGTERM-to-SIGKILL delay when stopping"
    )
    parser.add_argument(
        "-m", "--module", action="store_true", help="run TARGET as a module (python -m)"
    )
    parser.add_argument("target", help="script, or module with -m")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the target")
    return parser


def plan_from_args(args: argparse.Namespace) -> LaunchPlan:
    """Build and check the plan. Raises ValueError on inconsistent ranks."""
    command = (sys.executable, "-m", args.target) if args.module else (sys.executable, args.target)
    plan = LaunchPlan(
        offset=args.offset,
        size=args.size,
        world_size=args.world_size,
        master_addr=args.master_addr,
        master_port=args.master_port,
        command=(*command, *args.args),
        node=f"{socket.gethostname()}/offset-{args.offset}",
    )
    plan.check()
    return plan


def _stop(procs: Sequence[subprocess.Popen], sig: int, grace_s: float) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode  # killed by a signal


def _supervise(plan: LaunchPlan, procs: Sequence[subprocess.Popen], grace_s: float) -> int:
    while True:
        codes = [p.poll() for p in procs]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            local_rank, code = failed[0]
            print(
                f"[launch] rank {plan.offset + local_rank} exited with code {_exit_code(code)}; "
                f"stopping the other processes of this node",
                file=sys.stderr,
                flush=True,
            )
            _stop(procs, signal.SIGTERM, grace_s)
            return _exit_code(code)
        if all(c == 0 for c in codes):
            return 0
        time.sleep(POLL_INTERVAL_S)


def launch(
    plan: LaunchPlan, grace_s: float = 10.0, base_env: Mapping[str, str] | None = None
) -> int:
    """Start the plan's processes, wait for them, return the job's exit code on this node."""
    base = os.environ if base_env is None else base_env
    procs = [
        subprocess.Popen(plan.command, env=worker_env(plan, i, base)) for i in range(plan.size)
    ]
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        _stop(procs, signum, grace_s)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = _supervise(plan, procs, grace_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 + received[0] if received else code


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        plan = plan_from_args(args)
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return launch(plan, grace_s=args.grace_s)


if __name__ == "__main__":
    sys.exit(main())
