"""``trainyard workflow submit SPEC --pool slurm-local --dry-run`` through the real CLI path:
the CLI in this process, over HTTP, to the server's own app (``python -m trainyard.server``'s
``build_app``: store, engine and pools from ``$TRAINYARD_HOME``) served by uvicorn in a thread.
Its output (the rendered spec, then each group's sbatch command and batch script) is pinned
by ``golden/cli_dry_run.txt`` with the home folder written as ``$TRAINYARD_HOME``;
``UPDATE_GOLDEN=1`` rewrites it. No Slurm is needed: a dry run submits nothing."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from slurm_support import check_golden

from trainyard.cli.main import main
from trainyard.server.__main__ import build_app

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
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    for name in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN", "TRAINYARD_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    monkeypatch.setenv("TRAINYARD_SERVER_URL", f"http://127.0.0.1:{sock.getsockname()[1]}")
    yield home
    server.should_exit = True
    thread.join(timeout=15)
    sock.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_cli_dry_run_prints_the_sbatch_commands_and_scripts(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "train.yaml"
    spec.write_text(SPEC)
    out = _cli(capsys, "workflow", "submit", str(spec), "--pool", "slurm-local", "--dry-run")
    check_golden("cli_dry_run.txt", out.replace(str(home), "$TRAINYARD_HOME"))
    assert _cli(capsys, "workflow", "list", "-t", "json").strip() == "[]"
    assert not (home / "runs").exists()  # nothing written for the jobs either
