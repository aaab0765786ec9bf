"""Per-group cost of egress set-up, measured alone (issue 11, docs/benchmarks.md "Egress").

Three ways to make a group's network namespace, each ``--groups`` times in a row, in this
process as the launcher does (root only):

- ``none``: ``netns.namespace_fd`` alone (loopback only);
- ``router``: the same, plus a veth to an egress router (``EgressRouter.attach``: the pair,
  two addresses, a route), the router made once before the clock starts;
- ``pasta``: the same, plus a pasta of its own (``netns.start_egress``, waited for, then
  ``stop_egress``), as before the router (``--pasta-groups`` times: it is slow).

CPU is this process's (user + system) plus its reaped children's (pasta), set-up and undo
(closing the descriptor, ending pasta); the kernel's work charged to no process (a
namespace's teardown in a work queue) is not in it. Wall time is the set-up's alone.

Usage: ``python bench/egress_setup.py [--groups 200] [--pasta-groups 40]``
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Callable

from trainyard.backends.local import netns
from trainyard.backends.local.router import EgressRouter


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(make_one: Callable[[], Callable[[], None]], count: int) -> tuple[float, float]:
    """(wall ms, CPU ms) per group; ``make_one`` makes a group and returns its undo. The wall
    clock stops before the undos run; the CPU counts them (a child's CPU is known once it is
    reaped)."""
    undo = []
    cpu0, wall0 = _cpu_s(), time.perf_counter()
    for _ in range(count):
        undo.append(make_one())
    wall = time.perf_counter() - wall0
    for step in undo:
        step()
    return wall / count * 1000, (_cpu_s() - cpu0) / count * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--pasta-groups", type=int, default=40)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (namespaces held as descriptors, veth pairs)", file=sys.stderr)
        return 2
    router = EgressRouter.make()

    def bare() -> Callable[[], None]:
        fd, _ = netns.namespace_fd(())
        return lambda: os.close(fd)

    def routed() -> Callable[[], None]:
        fd, _ = netns.namespace_fd(())
        link = router.attach(fd)
        return lambda: (router.detach(link), os.close(fd))  # type: ignore[func-returns-value]

    def own_pasta() -> Callable[[], None]:
        fd, _ = netns.namespace_fd(())
        proc = netns.start_egress(ns_fd=fd)
        return lambda: (netns.stop_egress(proc), os.close(fd))  # type: ignore[func-returns-value]

    try:
        for name, make_one, count in (
            ("none", bare, args.groups),
            ("router", routed, args.groups),
            ("pasta", own_pasta, args.pasta_groups),
        ):
            wall_ms, cpu_ms = measure(make_one, count)
            print(
                f"{name:7s} {count:4d} groups: {wall_ms:6.2f} ms wall, {cpu_ms:6.2f} ms CPU per group"
            )
    finally:
        router.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
