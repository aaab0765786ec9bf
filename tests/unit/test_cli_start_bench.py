"""The pure parts of bench/cli_start.py (issue 15): the alternating order of the trees and
the summary of a tree's runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cli_start.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainyard_bench_cli_start", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_order_flips_each_round(bench: ModuleType) -> None:
    assert [bench.order(["a", "b"], i) for i in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]


def test_the_summary_is_the_best_and_the_median(bench: ModuleType) -> None:
    runs = [(0.3, 0.2), (0.1, 0.25), (0.2, 0.1)]
    assert bench.summary(runs) == "wall 0.100 s (median 0.200), CPU 0.100 s (median 0.200)"


def test_the_command_is_issue_15s_dry_run(bench: ModuleType) -> None:
    assert bench.COMMAND[:2] == ["workflow", "submit"] and bench.EXAMPLE.is_file()
    assert bench.COMMAND[-3:] == ["--set", "n_gpus_per_node=1", "--dry-run"]
