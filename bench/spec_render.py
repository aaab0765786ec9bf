"""Benchmark: render + validate OSMO's N-node torchrun template, N = 10 .. 10,000.

Run: ``.venv/bin/python bench/spec_render.py [--repeat R] [--sizes 10 100 1000 4000]``.

For each N it times ``trainyard.spec.load`` (render in the sandboxed child, parse, every
check, localpath files read) and, on the same rendered text, a bare ``yaml.safe_load``
(pure-Python PyYAML, the usual baseline) and ``yaml.load(..., CSafeLoader)`` (libyaml), on a
pool of ``--pool-nodes`` nodes (default: the largest N; each task asks a node's 8 GPUs).
It prints a Markdown table; the best of R runs is reported for each, as wall time and as
CPU time (this process plus the render child), the latter being steadier on a shared
machine. The goal: cost linear in N, N=1,000 under 0.3 s. Not a test: numbers depend on
the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from trainyard import spec
from trainyard.home import trainyard_home
from trainyard.pools import NodeSpec, Pool

TEMPLATE = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "osmo-specs"
    / "dnn_training"
    / "torchrun_multinode"
    / "train_template.yaml"
).resolve()
SIZES = (10, 100, 1_000, 4_000)
"""Tasks per spec; 4,000 render to about 3.4 MiB, under ``spec.MAX_SPEC_BYTES`` (4 MiB): a
larger spec is refused, so the largest row measures the largest spec trainyard accepts."""


def best_of(repeat: int, func: Callable[[], object]) -> tuple[float, float]:
    """The shortest wall time and the shortest CPU time (this process and its reaped
    children, i.e. the render child) of ``repeat`` calls, in seconds."""
    walls, cpus = [], []
    for _ in range(repeat):
        before, start = _cpu_s(), time.perf_counter()
        func()
        walls.append(time.perf_counter() - start)
        cpus.append(_cpu_s() - before)
    return min(walls), min(cpus)


def _cpu_s() -> float:
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(n: int, repeat: int, pool: Pool) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds for load (``pool``'s checks included: the gang fit, data roots),
    render alone, and the two YAML baselines at ``n`` nodes."""
    storage = f"file://{trainyard_home() / 'storage' / 'bench'}"  # inside the data roots
    values = {"n_nodes": n, "storage_url": storage}
    text = TEMPLATE.read_text()
    rendered = spec.render(text, values=values)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    doc = spec.load(TEMPLATE, set_values=values, pool=pool)
    assert len(doc.workflow.all_tasks()) == n
    return {
        "load": best_of(repeat, lambda: spec.load(TEMPLATE, set_values=values, pool=pool)),
        "render": best_of(repeat, lambda: spec.render(text, values=values)),
        "safe_load": best_of(max(1, repeat // 2), lambda: yaml.safe_load(rendered)),
        "c_load": best_of(repeat, lambda: yaml.load(rendered, Loader=loader)),
        "bytes": (len(rendered.encode()), 0.0),
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument(
        "--pool-nodes",
        type=int,
        default=None,
        help="load against a local pool of this many nodes (default: the largest N), its "
        "checks included: the gang fit of N tasks of 8 GPUs on these nodes",
    )
    args = parser.parse_args()
    count = args.pool_nodes or max(args.sizes)
    pool = Pool(name="bench", nodes=[NodeSpec(name=f"n{i}") for i in range(count)])
    if not TEMPLATE.exists():
        print(
            f"missing {TEMPLATE}: the OSMO specs (shared/) must sit beside the repo",
            file=sys.stderr,
        )
        return 1
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"libyaml: {yaml.__with_libyaml__}"
    )
    print(
        "| N | rendered | load wall | load CPU | CPU per task | render alone (wall) "
        "| yaml.safe_load wall | load / safe_load | CSafeLoader wall | load / CSafeLoader |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.sizes:
        r = measure(n, args.repeat, pool)
        load, safe, c_load = r["load"][0], r["safe_load"][0], r["c_load"][0]
        print(
            f"| {n:,} | {r['bytes'][0] / 2**20:.2f} MiB | {_ms(load)} | {_ms(r['load'][1])} "
            f"| {r['load'][1] / n * 1e6:.0f} µs | {_ms(r['render'][0])} | {_ms(safe)} | {load / safe:.2f} "
            f"| {_ms(c_load)} | {load / c_load:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
