"""Issue 25: ``pip install`` and ``python -m pip install`` work in a task and land in the
task's own environment in its root, while trainyard's environment is untouched and
``trainyard``, ``osmo`` and ``torchrun`` stay on PATH (no-sandbox runner here; the sandboxed
case is tests/integration/cli/test_task_pip_e2e.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from runner_support import MakeRun, execute, log_text

WHEELS = Path("/opt/pypi/simple/aenum")


def test_python_and_pip_are_the_tasks_own(make_run: MakeRun) -> None:
    script = (
        'python -c "import sys, trainyard; print(\'prefix\', sys.prefix)"\n'
        'for p in pip python trainyard osmo torchrun; do echo "$p $(command -v $p)"; done\n'
        'python -m pip --version\n'
        'torchrun --help > /dev/null && echo "torchrun runs"\n'
    )
    run = make_run(script=script)
    assert execute(run) == 0, log_text(run)
    text = log_text(run)
    root = str(run.sandbox.root)
    assert f"prefix {root}/trainyard/venv" in text
    assert f"pip {root}/trainyard/venv/bin/pip" in text
    assert f"torchrun {root}/trainyard/venv/bin/torchrun" in text
    assert "torchrun runs" in text  # trainyard's torchrun, run by the task's python
    venv_bin = str(Path(sys.executable).parent)
    assert f"trainyard {venv_bin}/trainyard" in text and f"osmo {venv_bin}/osmo" in text


def test_pip_install_lands_in_the_tasks_root(make_run: MakeRun) -> None:
    if not WHEELS.is_dir():
        import pytest

        pytest.skip(f"no local package index at {WHEELS}")
    script = (
        f"pip install --no-index --find-links {WHEELS} aenum\n"
        "python -c 'import aenum; print(\"from\", aenum.__file__)'\n"
        f"python -m pip install --no-index --find-links {WHEELS} aenum\n"
    )
    run = make_run(script=script)
    assert execute(run) == 0, log_text(run)
    text = log_text(run)
    assert f"from {run.sandbox.root}/trainyard/venv/lib/" in text
    assert "Requirement already satisfied: aenum" in text
    import importlib.util

    assert importlib.util.find_spec("aenum") is None  # trainyard's own never got it
