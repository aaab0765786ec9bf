"""Issue 12: a pool whose backend is not available here (``backend: warp-drive``, which no
registry entry names; every real backend is installed now) is refused at submit and at local
validation; the server still starts and runs the other pools' workflows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_e2e_support import processes_of, run_cli, wait_gone

SPEC = """workflow:
  name: where
  tasks:
  - name: t
    image: busybox
    command: [echo]
    args: [hi]
"""


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    made = tmp_path / "k8s home"
    made.mkdir()
    (made / "pools.yaml").write_text("pools:\n  k8s:\n    backend: warp-drive\n    node_count: 2\n")
    yield made
    run_cli(made, "server", "stop")
    assert not wait_gone(processes_of(made), timeout_s=30)


def test_a_pool_without_its_backend_is_refused_and_the_others_run(
    home: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "where.yaml"
    spec.write_text(SPEC)
    local = run_cli(home, "workflow", "validate", str(spec), "--pool", "k8s", "--local")
    assert local.code == 4, local.err
    assert "pool 'k8s': backend 'warp-drive' is not available" in local.err
    refused = run_cli(home, "workflow", "submit", str(spec), "--pool", "k8s")
    assert refused.code == 4, refused.err
    assert "Workflow submitted" not in refused.out
    assert "pool 'k8s': backend 'warp-drive' is not available" in refused.err
    assert "backends available: fake, kubernetes, local, slurm" in refused.err
    ran = run_cli(home, "workflow", "submit", str(spec), "--wait", "-t", "json")
    assert ran.code == 0, ran.err
    assert ran.json()["status"] == "COMPLETED"
    assert run_cli(home, "workflow", "list", "-t", "json").json()[0]["pool"] == "local"
    # and the server starts again with that pools file (it did not, issue 12)
    assert run_cli(home, "server", "stop").code == 0
    again = run_cli(home, "workflow", "list", "-t", "json")
    assert again.code == 0, again.err
    assert [w["id"] for w in again.json()] == ["where-1"]


def test_the_server_starts_with_a_stored_workflow_of_a_pool_now_unavailable(
    home: Path, tmp_path: Path
) -> None:
    (home / "pools.yaml").write_text("pools:\n  k8s:\n    backend: local\n    node_count: 1\n")
    spec = tmp_path / "nap.yaml"
    spec.write_text(SPEC.replace("[echo]", "[sleep]").replace("[hi]", '["4"]'))
    first = run_cli(home, "workflow", "submit", str(spec), "--pool", "k8s", "-t", "json")
    assert first.code == 0, first.err
    assert run_cli(home, "server", "stop").code == 0
    (home / "pools.yaml").write_text("pools:\n  k8s:\n    backend: warp-drive\n")
    listed = run_cli(home, "workflow", "list", "-t", "json")  # "No module named ..." before
    assert listed.code == 0, listed.err + (home / "server.log").read_text()
    assert [w["pool"] for w in listed.json()] == ["k8s"]
    ran = run_cli(home, "workflow", "submit", str(spec), "--wait")
    assert ran.code == 0, ran.err
    assert "backend 'warp-drive' is not available" in (home / "server.log").read_text()
