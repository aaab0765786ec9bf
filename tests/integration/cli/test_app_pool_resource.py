"""``trainyard app|pool|resource`` against the real server."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from cli_e2e_support import OSMO_PLATFORMS, SPECS, Server

# An elastic-like template: max_nodes tasks of one gang, the master hosting the rendezvous.
ELASTIC = """
workflow:
  name: elastic-{{ max_nodes }}
  groups:
  - name: training
    tasks:
    {% for item in range(max_nodes) %}
    - name: {{ 'master' if item == 0 else 'worker_' ~ item }}
      lead: {{ 'true' if item == 0 else 'false' }}
      command: [sh, -c]
      args: ["echo rank {{ item }} of {{ max_nodes }} meets at {{host:master}}:{{ port }}"]
    {% endfor %}
default-values:
  max_nodes: 2
  port: 29400
"""
KEYS = {"cpu", "gpu", "memory_bytes", "storage_bytes"}


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def test_app_create_list_show_submit_delete(server: Server, tmp_path: Path) -> None:
    first = write(tmp_path / "elastic.yaml", ELASTIC)
    made = server.cli("app", "create", "elastic", first)
    assert (made.code, made.out.strip()) == (0, "App elastic version 1 created"), made.err
    second = write(tmp_path / "elastic2.yaml", ELASTIC.replace("port: 29400", "port: 29500"))
    made_json = server.main("app", "create", "elastic", second, "-t", "json").json()
    assert {k: made_json[k] for k in ("name", "version", "warnings", "owner")} == {
        "name": "elastic",
        "version": 2,
        "warnings": [],
        "owner": made_json["owner"],
    }

    listed = server.main("app", "list", "-t", "json").json()
    assert [(a["name"], a["version"]) for a in listed if a["name"] == "elastic"] == [("elastic", 2)]
    assert "elastic" in server.main("app", "list").out
    assert "port: 29400" in server.main("app", "show", "elastic", "--version", "1").out
    assert "port: 29500" in server.main("app", "show", "elastic").out

    run = server.cli("app", "submit", "elastic", "--set", "max_nodes=3", "--wait")
    assert run.code == 0, run.out + run.err
    workflow_id = run.out.split("Workflow submitted: ")[1].split()[0]
    assert workflow_id.startswith("elastic-3-")
    data = server.query(workflow_id)
    assert [t["name"] for g in data["groups"] for t in g["tasks"]] == [
        "master",
        "worker_1",
        "worker_2",
    ]
    # The lead's line only: when the lead ends, the group's other tasks are stopped, so a
    # worker may be stopped before its echo ran (OSMO's lead semantics, not a failure).
    logs = server.logs(workflow_id)
    assert "[master] rank 0 of 3 meets at 127." in logs and ":29500" in logs

    gone = server.cli("app", "delete", "elastic")
    assert (gone.code, gone.out.strip()) == (0, "App elastic deleted (2 versions)"), gone.err
    assert all(a["name"] != "elastic" for a in server.main("app", "list", "-t", "json").json())
    missing = server.main("app", "show", "elastic")
    assert missing.code == 3 and "elastic" in missing.err


ELASTIC_SEED = SPECS / "dnn_training" / "torchrun_elastic" / "train.yaml"


@pytest.mark.skipif(not ELASTIC_SEED.is_file(), reason=f"OSMO spec not found at {ELASTIC_SEED}")
def test_the_seed_app_sample_elastic_torchrun_renders_max_nodes_tasks(
    server: Server, tmp_path: Path
) -> None:
    """The issue's seed: ``app submit sample-elastic-torchrun --set max_nodes=8``, dry-run."""
    storage = f"storage_url={(server.home / 'storage' / tmp_path.name / 'bucket').as_uri()}"
    unset = server.main("app", "create", "sample-elastic-torchrun", str(ELASTIC_SEED))
    assert unset.code == 2 and "'storage_url' is not set; set it with --set" in unset.err
    made = server.main(
        "app",
        "create",
        "sample-elastic-torchrun",
        str(ELASTIC_SEED),
        "--set",
        storage,
        "-t",
        "json",
    )
    assert made.json()["name"] == "sample-elastic-torchrun"
    before = server.ids()

    shown = server.main(
        "app",
        "submit",
        "sample-elastic-torchrun",
        "--set",
        "max_nodes=8",
        storage,
        "--dry-run",
        "-t",
        "json",
    ).json()
    assert shown["dry_run"] is True and shown["name"] == "elastic-sample"
    tasks = yaml.safe_load(shown["spec"])["workflow"]["groups"][0]["tasks"]
    assert [t["name"] for t in tasks] == ["master", *(f"worker_{i}" for i in range(1, 8))]
    assert [t.get("lead", False) for t in tasks] == [True] + [False] * 7
    run_sh = tasks[0]["files"][0]["contents"]
    assert "--nnodes 2:8" in run_sh and "--rdzv_endpoint {{host:master}}:29400" in run_sh
    assert all(t["files"][1]["localpath"] == "train.py" for t in tasks)
    table = server.cli(
        "app", "submit", "sample-elastic-torchrun", "--set", "max_nodes=8", storage, "--dry-run"
    )
    assert table.code == 0 and "- name: worker_7" in table.out, table.err
    assert server.ids() == before  # nothing was submitted
    assert server.main("app", "delete", "sample-elastic-torchrun").code == 0


def test_app_create_refuses_a_bad_spec_and_stores_nothing(server: Server, tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.yaml", ELASTIC.replace("command: [sh, -c]", "command: []"))
    got = server.main("app", "create", "broken", bad)
    assert got.code == 2 and "command is empty" in got.err
    assert all(a["name"] != "broken" for a in server.main("app", "list", "-t", "json").json())


def test_pool_list(server: Server) -> None:
    pools = {p["name"]: p for p in server.main("pool", "list", "-t", "json").json()}
    assert set(pools) == {"local", "osmo"}
    assert (pools["local"]["backend"], pools["local"]["nodes"]) == ("local", 4)
    assert pools["osmo"]["platforms"] == sorted(OSMO_PLATFORMS)
    table = server.cli("pool", "list")
    assert table.code == 0 and "local" in table.out and "dgx-h100" in table.out


def test_resource_list_shapes(server: Server) -> None:
    rows = server.main("resource", "list", "-t", "json").json()
    assert {r["pool"] for r in rows} == {"local", "osmo"}
    for row in rows:
        assert set(row) == {"pool", "node", "platform", "capacity", "used", "free", "virtual"}
        assert row["virtual"] is True  # neither local nor osmo is strict
        assert set(row["capacity"]) == set(row["used"]) == set(row["free"]) == KEYS
        assert all(row["free"][k] == row["capacity"][k] - row["used"][k] for k in KEYS)
    osmo = server.main("resource", "list", "--pool", "osmo", "-t", "json").json()
    assert sorted(r["platform"] for r in osmo) == sorted(OSMO_PLATFORMS)
    assert osmo[0]["capacity"] == {
        "cpu": 64,
        "gpu": 8,
        "memory_bytes": 512 * 2**30,
        "storage_bytes": 2 * 2**40,
    }
    table = server.main("resource", "list", "--pool", "osmo")
    assert table.code == 0 and "/512GiB" in table.out and "/2TiB" in table.out
    unknown = server.main("resource", "list", "--pool", "nope")
    assert unknown.code == 3 and "local, osmo" in unknown.err
