"""trainyard.training runs inside tasks: it imports nothing else of trainyard."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import trainyard.training

PACKAGE = Path(trainyard.training.__file__).parent


def test_no_module_imports_the_rest_of_trainyard() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and node.level == 0
                    else []
                )
            )
            offenders += [
                f"{path.name}: {n}"
                for n in names
                if n.startswith("trainyard") and not n.startswith("trainyard.training")
            ]
    assert offenders == []


def test_importing_the_kit_loads_no_other_trainyard_module() -> None:
    code = (
        "import sys, trainyard.training.train, trainyard.training.barrier, trainyard.training.launch;"
        "print(sorted(m for m in sys.modules if m.startswith('trainyard')"
        " and not m.startswith('trainyard.training') and m != 'trainyard'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_barrier_and_launcher_do_not_need_torch() -> None:
    code = (
        "import sys, trainyard.training.barrier, trainyard.training.launch;"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
