"""``trainyard workflow submit SPEC --pool slurm-local --dry-run`` through the real CLI path:
the CLI in this process, over HTTP, to the server's own app in a thread
(tests/support/served_cli.py).
Its output (the rendered spec, then each group's sbatch command and batch script) is pinned
by ``golden/cli_dry_run.txt`` with the home folder written as ``$TRAINYARD_HOME``;
``UPDATE_GOLDEN=1`` rewrites it. No Slurm is needed: a dry run submits nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from served_cli import cli, served
from slurm_support import check_golden

POOLS = """pools:
  slurm-local:
    backend: slurm
    nodes:
    - {name: ty-node1, cpu: 2, memory: 8Gi}
    - {name: ty-node2, cpu: 2, memory: 8Gi}
    options:
      partition: trainyard
      account: ml
      python: /opt/trainyard/bin/python
      slurm_conf: /etc/slurm/slurm.conf
"""
SPEC = """workflow:
  name: {{ name }}
  timeout:
    exec_timeout: 1h
  resources:
    default: {cpu: 2, memory: 4Gi}
    small: {cpu: 1, memory: 1Gi}
  groups:
  - name: prepare
    tasks:
    - name: fetch
      command: [sh, -c, "echo data > {{output}}/data.txt"]
  - name: train
    tasks:
    - name: master
      lead: true
      command: [sh, -c, "echo master at {{host:master}}; cat {{input:0}}/data.txt"]
      inputs: [{task: fetch}]
    - name: worker
      resource: small
      command: [sh, -c, "echo worker reaches {{host:master}}"]
default-values:
  name: dry-run
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A home whose pools file names the Slurm pool, its server up, the CLI pointed at it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "pools.yaml").write_text(POOLS)
    with served(home, monkeypatch):
        yield home


def test_cli_dry_run_prints_the_sbatch_commands_and_scripts(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "train.yaml"
    spec.write_text(SPEC)
    out = cli(capsys, "workflow", "submit", str(spec), "--pool", "slurm-local", "--dry-run")
    check_golden("cli_dry_run.txt", out.replace(str(home), "$TRAINYARD_HOME"))
    assert cli(capsys, "workflow", "list", "-t", "json").strip() == "[]"
    assert not (home / "runs").exists()  # nothing written for the jobs either
