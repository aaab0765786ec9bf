"""The pure parts of bench/data_transfer.py (issue 11): the layouts it times (many files,
one file, many small files), the rows with CPU time next to wall time, and a tiny real run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "data_transfer.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainyard_bench_data_transfer", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_layouts_cover_many_files_one_file_and_many_small_files(bench: ModuleType) -> None:
    chosen = bench.layouts(
        ["files", "one", "small"], size_mb=8, files=10, small_files=300, small_kb=4
    )
    assert chosen == [
        ("10 files", 8 * 2**20, 10),
        ("1 file", 8 * 2**20, 1),
        ("300 files of 4 KiB", 300 * 4096, 300),
    ]
    with pytest.raises(SystemExit, match="unknown huge.*known: files, one, small"):
        bench.layouts(["huge"], 8, 10, 300, 4)


def test_rows_give_wall_and_cpu_ratios_to_cp(bench: ModuleType) -> None:
    results = {"cp -r": [(1.0, 0.5), (2.0, 0.5)], "dataset upload": [(2.0, 1.0), (2.0, 1.0)]}
    rows = bench.report("2 files", 2**20, results)
    assert rows[0] == "| 2 files | cp -r | 1.000 | 1 | 1.00 | 1.00 | 0.500 | 1.00 |"
    assert rows[1] == "| 2 files | dataset upload | 2.000 | 0 | 0.50 | 0.75 | 1.000 | 0.50 |"


def test_a_tiny_run_prints_a_row_per_layout_and_method(
    bench: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRAINYARD_DATASET_URL", raising=False)
    assert (
        bench.main(
            [
                "--size-mb",
                "1",
                "--files",
                "3",
                "--small-files",
                "20",
                "--small-kb",
                "1",
                "--repeat",
                "1",
                "--dir",
                str(tmp_path),
                "--methods",
                "dataset upload,dataset download",
            ]
        )
        == 0
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 3 * 3  # the header, then cp + 2 methods per layout
    assert any(r.startswith("| 20 files of 1 KiB | dataset download |") for r in rows)
