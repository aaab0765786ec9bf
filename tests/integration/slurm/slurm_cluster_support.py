"""Helpers for Slurm integration tests: finding the test cluster, the CLI against it, an engine
in a thread."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from trainyard import spec
from trainyard.engine.machine import WorkflowState
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import Pool, load_pools
from trainyard.store import Store, WorkflowRecord

SLURM_DIR = Path(os.environ.get("TRAINYARD_SLURM_DIR", "/tmp/trainyard-slurm"))
POOL_NAME = "slurm-local"
SPECS = (Path(__file__).resolve().parents[3] / ".." / "shared" / "osmo-specs").resolve()
REPO = Path(__file__).resolve().parents[3]
TRAINYARD = Path(sys.executable).parent / "trainyard"


def cli_env(home: Path) -> dict[str, str]:
    """The environment of a ``trainyard`` CLI on ``home`` that reaches the test cluster: no
    server address or token of the caller's, the cluster's ``SLURM_CONF``, wide output."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env.update(
        TRAINYARD_HOME=str(home),
        SLURM_CONF=str(SLURM_DIR / "slurm.conf"),
        PATH=f"{TRAINYARD.parent}:{env.get('PATH', '')}",
        COLUMNS="200",
    )
    return env


def run_cli(home: Path, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    """``trainyard ARGS`` on ``home`` from the repository's root, its output captured."""
    return subprocess.run(
        [str(TRAINYARD), *args],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        cwd=REPO,
    )


def register_pools(home: Path) -> None:
    """``scripts/slurm-cluster.sh start`` with ``home``: on a cluster already up it only writes
    the cluster's pools (``slurm-local``, ``slurm-rehearsal``) into ``home``; never restarts it."""
    started = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-cluster.sh"), "start"],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert started.returncode == 0, started.stderr


def cluster_pool() -> Pool:
    """The test cluster's pool, as ``scripts/slurm-cluster.sh start`` wrote it."""
    return load_pools(SLURM_DIR / "pools.yaml")[POOL_NAME]


def why_no_cluster() -> str | None:
    """None when the test cluster answers, else why these tests are skipped."""
    if shutil.which("sbatch") is None:
        return "sbatch is not on PATH (scripts/slurm-cluster.sh start installs Slurm and starts a cluster)"
    if not (SLURM_DIR / "pools.yaml").exists():
        return f"no Slurm test cluster ({SLURM_DIR}/pools.yaml missing): run scripts/slurm-cluster.sh start"
    conf = cluster_pool().options.get("slurm_conf")
    env = {**os.environ, **({"SLURM_CONF": conf} if conf else {})}
    try:
        ping = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, env=env, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol ping failed: {exc}"
    if "UP" not in ping.stdout:
        return f"the Slurm test cluster does not answer: {(ping.stdout + ping.stderr).strip()}"
    return None


class EngineRunner:
    """An ``Engine`` on one pool with its state under ``home``, stepped by a background thread."""

    def __init__(self, home: Path, pool: Pool) -> None:
        self.home = home
        self.pool = pool
        self.engine = Engine(
            Store(f"sqlite:///{home / 'db.sqlite'}"),
            home,
            pools={pool.name: pool},
            poll_interval_s=0.05,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self.engine.run_forever, args=(self._stop,), daemon=True
        )
        self._thread.start()
        self.submitted: list[str] = []

    def submit_spec(
        self, path: Path, sets: tuple[str, ...] = (), *, pool: Pool | None = None
    ) -> str:
        """Load a spec (``--set`` style args) and submit it; returns the workflow id."""
        use = pool or self.pool
        self.engine.pools.setdefault(use.name, use)
        doc = spec.load(path, set_values=spec.parse_set_values(list(sets)), pool=use)
        record = self.engine.submit(
            Submission(
                spec=doc.workflow,
                spec_text=path.read_text(),
                user="tester",
                pool=use,
                labels=dict(doc.workflow.labels),
            )
        )
        self.submitted.append(record.id)
        return record.id

    def wait(self, workflow_id: str, timeout_s: float = 600) -> WorkflowRecord:
        return self.engine.wait(workflow_id, timeout_s)

    def state(self, workflow_id: str) -> WorkflowState:
        return self.engine.state(workflow_id)

    def log(self, workflow_id: str, task: str) -> str:
        retry = self.state(workflow_id).tasks[task].retry_id
        path = self.engine.run_dir(workflow_id, task, retry) / "task.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        for wid in self.submitted:
            self.engine.cancel(wid)
        self._stop.set()
        self._thread.join(timeout=10)
