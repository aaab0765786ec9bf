"""The CLI's start runs no garbage collection while it imports and builds its command (issue
15: ~60 collections over objects that live as long as the process cost ~8 ms of ~110), and
leaves the collector as it found it. Counted with ``gc.callbacks`` in a fresh interpreter,
up to the submit request's ``socket.connect`` (an audit event); never timed."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

from trainyard.cli.main import collector_paused

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torchrun_multinode" / "train.yaml"

PROBE = """
import gc, json, os, sys
os.environ["TRAINYARD_HOME"] = sys.argv[2]
os.environ["TRAINYARD_SERVER_URL"] = "http://127.0.0.1:9"  # nothing listens: exit 7
collections = []
gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
at_connect = []
def hook(event, args):
    if event == "socket.connect" and not at_connect:
        at_connect.append(len(collections))
sys.addaudithook(hook)
from trainyard.cli.main import main
typer_at_import = "typer" in sys.modules
gc.collect()  # this probe's and the import's objects: none left to count
del collections[:]
status = main(["workflow", "submit", sys.argv[1], "--set", "n_gpus_per_node=1", "--dry-run"])
print(json.dumps({"status": status, "typer_at_import": typer_at_import, "at_connect": at_connect,
                  "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""


def _probe(home: Path) -> dict[str, object]:
    """The probe's findings, its second run: the first writes the byte code (compiling a
    module from source makes objects of its own, before the module's code runs)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for _run in range(2):
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(EXAMPLE), str(home)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
    return json.loads(done.stdout.splitlines()[-1])


def test_no_collection_while_importing_and_building_and_few_before_the_request(
    tmp_path: Path,
) -> None:
    seen = _probe(tmp_path)
    assert seen["status"] == 7
    assert seen["typer_at_import"] is False  # imported by main(), in its pause
    # importing typer and the workflow group (httpx, the spec layer) and building the
    # command: none; what runs after (click's parse, where typer 0.29 imports pydantic for
    # its first conversion, ~25; the spec read) fewer than the ~60 made without the pause
    assert len(seen["at_connect"]) == 1 and seen["at_connect"][0] < 60, seen
    assert seen["enabled"] is True
    assert seen["frozen"] == 0  # main(argv) called in-process freezes nothing


def test_collector_paused_restores_the_state_it_found() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off: stays off
    finally:
        gc.enable()


def test_the_console_script_freezes_what_its_start_made() -> None:
    code = (
        "import gc\n"
        "from trainyard.cli.main import collector_paused\n"
        "with collector_paused(freeze=True):\n"
        "    kept = [[i] for i in range(1000)]\n"
        "print(gc.isenabled(), gc.get_freeze_count() >= 1000)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True"]
