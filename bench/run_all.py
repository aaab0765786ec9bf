"""Run every benchmark of ``bench/`` in turn (``make bench``), not a test.

Each benchmark is its own script with its own flags (see its docstring); this runs them with
the settings ``docs/benchmarks.md`` records, one after the other so they do not share the
machine, and says which were left out and why. Numbers depend on the machine and on what else
runs on it: record them with the machine's description.

Usage:
    .venv/bin/python bench/run_all.py [--quick] [--only NAME ...]

``--quick`` uses small sizes (minutes, not an hour): for checking that the benchmarks run,
not for the record. The Slurm benchmark runs only where ``scripts/slurm-cluster.sh start``
has brought the throwaway cluster up (``SLURM_CONF`` names its configuration).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SLURM_CONF = Path("/tmp/trainyard-slurm/slurm.conf")  # where scripts/slurm-cluster.sh puts it

# name -> (arguments for the record, arguments for --quick)
RUNS: dict[str, tuple[list[str], list[str]]] = {
    "spec_render": (["--repeat", "7"], ["--repeat", "2", "--sizes", "10", "100", "1000"]),
    "engine_overhead": (["overhead", "--repeat", "7"], ["overhead", "--repeat", "2"]),
    "engine_throughput": (["throughput", "--tasks", "1000"], ["throughput", "--tasks", "100"]),
    "api_load": (["--submissions", "100"], ["--submissions", "20"]),
    "data_transfer": (["--repeat", "5"], ["--size-mb", "64", "--repeat", "2"]),
    "training_throughput": (
        ["--launch-compare", "--repeat", "6", "--epochs", "40"],
        ["--epochs", "5", "--repeat", "1"],
    ),
    "launch_overhead": (["--pairs", "5", "--no-upload-mode"], ["--pairs", "1", "--epochs", "2"]),
    "slurm_submit": (["--repeat", "10"], ["--repeat", "2"]),
    "k8s_gang_submit": (["--tasks", "64", "--repeat", "3"], ["--tasks", "8", "--repeat", "1"]),
    "chaos": (["--workflows", "200", "--kills", "50"], ["--workflows", "6", "--kills", "2"]),
    "logs_memory": (["--log-mb", "200", "--line-mb", "100"], ["--log-mb", "20", "--line-mb", "10"]),
}
SCRIPT = {"engine_overhead": "engine_throughput", "engine_throughput": "engine_throughput"}


def slurm_up() -> bool:
    """True where the throwaway cluster's configuration exists (its daemons answer sinfo)."""
    conf = Path(os.environ.get("SLURM_CONF", SLURM_CONF))
    if not conf.exists():
        return False
    done = subprocess.run(
        ["sinfo", "-h"],
        env={**os.environ, "SLURM_CONF": str(conf)},
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def run_one(name: str, args: list[str]) -> int:
    """Run one benchmark script with this interpreter; returns its exit status."""
    script = BENCH / f"{SCRIPT.get(name, name)}.py"
    print(f"\n=== {name}: {script.name} {' '.join(args)}", flush=True)
    started = time.monotonic()
    code = subprocess.run([sys.executable, str(script), *args], check=False).returncode
    print(f"=== {name}: exit {code} after {time.monotonic() - started:.0f} s", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, to check they run")
    parser.add_argument("--only", nargs="+", choices=sorted(RUNS), default=sorted(RUNS))
    opts = parser.parse_args(argv)
    failed: list[str] = []
    for name in [n for n in RUNS if n in opts.only]:
        if name == "slurm_submit" and not slurm_up():
            print(f"\n=== {name}: left out: no Slurm cluster (run scripts/slurm-cluster.sh start)")
            continue
        full, quick = RUNS[name]
        if run_one(name, quick if opts.quick else full) != 0:
            failed.append(name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
