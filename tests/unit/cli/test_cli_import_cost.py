"""The command line starts without the layers ``workflow submit`` never needs: no data layer
(fsspec and its protocols), no spec models, no engine, no server app, no pools
(``trainyard.home`` finds the home); and ``workflow submit`` imports only its own command
group, no server schema (``cli.request``'s body), no Jinja for a plain template
(``spec.template``), and no PyYAML nor render at all for a spec whose text does not name
``localpath`` (``cli.request.may_name_localpath``). Asserted on which modules are loaded,
never on time. (typer and httpx are used as they come: typer
converts values with pydantic; ``import httpx`` imports its own command line, rich with it,
where click is installed.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torchrun_multinode" / "train.yaml"
HEAVY = (
    "fsspec",
    "trainyard.data.urls",
    "trainyard.data.transfer",
    "trainyard.spec.models",
    "trainyard.engine.reconciler",
    "trainyard.store.db",
    "fastapi",
    "sqlalchemy",
    "torch",
    "trainyard.pools",
)


SUBMIT_HEAVY = (
    "trainyard.server.schema",
    "jinja2",
    "psutil",
    "yaml",
    "trainyard.spec.template",
)
"""Not loaded by ``workflow submit`` of a plain spec without ``localpath`` (its body sent;
psutil: only if the local server's address must be checked, ``test_cli_client_fallback.py``)."""
OTHER_GROUPS = tuple(
    f"trainyard.cli.{name}"
    for name in ("task", "app", "pool", "resource", "server", "dataset", "data")
)


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def test_starting_the_cli_and_building_a_submit_request_loads_no_heavy_layer() -> None:
    loaded = _loaded_after(
        "import trainyard.cli.main\n"
        "from pathlib import Path\n"
        "from trainyard.cli.request import spec_request\n"
        f"spec_request(Path({str(EXAMPLE)!r}),"
        " set_values=['n_gpus_per_node=1'], set_strings=[], set_env=[])"
    )
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_a_client_and_its_first_request_load_no_heavy_layer(tmp_path: Path) -> None:
    """Client() and a request (to a port where nothing listens: the import cost is the same)
    load no layer the CLI does not need."""
    loaded = _loaded_after(
        "import os\n"
        f"os.environ['TRAINYARD_HOME'] = {str(tmp_path)!r}\n"
        "import trainyard.cli.main\n"
        "from trainyard.cli.client import Client\n"
        "from trainyard.errors import ServerError\n"
        "client = Client(url='http://127.0.0.1:9', token='t')\n"
        "try:\n"
        "    client.json('GET', '/api/health')\n"
        "except ServerError:\n"
        "    pass"
    )
    assert "httpcore" in loaded  # the request was made through httpx
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_the_data_commands_still_load_the_data_layer_when_run(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    loaded = _loaded_after(
        "from trainyard.cli.main import main\n"
        f"assert main(['data', 'list', {str(tmp_path)!r}]) == 0"
    )
    assert "trainyard.data.urls" in loaded and "fsspec" in loaded


def _submit(tmp_path: Path, *args: str) -> str:
    """``main(["workflow", "submit", ...])`` against a port where nothing listens: the spec
    is read, rendered and its request built and sent (exit 7: nothing answered)."""
    return (
        f"import os\n"
        f"os.environ['TRAINYARD_HOME'] = {str(tmp_path)!r}\n"
        "os.environ['TRAINYARD_SERVER_URL'] = 'http://127.0.0.1:9'\n"
        "from trainyard.cli.main import main\n"
        f"assert main(['workflow', 'submit', {str(EXAMPLE)!r}, '--set', "
        f"'n_gpus_per_node=1', {', '.join(map(repr, args))}]) == 7\n"
    )


def test_workflow_submit_loads_its_group_only_and_no_jinja(tmp_path: Path) -> None:
    loaded = _loaded_after(_submit(tmp_path, "--dry-run"))
    assert {"trainyard.cli.workflow", "trainyard.cli.request", "httpcore"} <= loaded
    assert not loaded & set(SUBMIT_HEAVY + OTHER_GROUPS + HEAVY), sorted(
        loaded & set(SUBMIT_HEAVY + OTHER_GROUPS + HEAVY)
    )


def test_workflow_submit_wait_loads_no_more_before_its_request(tmp_path: Path) -> None:
    loaded = _loaded_after(_submit(tmp_path, "--wait", "--format", "json"))
    assert not loaded & set(SUBMIT_HEAVY + OTHER_GROUPS + HEAVY), sorted(
        loaded & set(SUBMIT_HEAVY + OTHER_GROUPS + HEAVY)
    )


def test_a_spec_with_a_filter_still_renders_with_jinja(tmp_path: Path) -> None:
    """(With a ``localpath`` file: a spec without one is not rendered by the CLI at all.)"""
    (tmp_path / "worker.sh").write_text("echo worker\n")
    spec = tmp_path / "filter.yaml"
    spec.write_text(
        EXAMPLE.read_text()
        .replace("{{ output_dataset }}", "{{ output_dataset|lower }}")
        .replace(
            "      - path: /tmp/worker.sh\n        contents: |",
            "      - path: /tmp/worker2.sh\n        localpath: worker.sh\n"
            "      - path: /tmp/worker.sh\n        contents: |",
        )
    )
    assert "localpath" in spec.read_text()
    loaded = _loaded_after(
        "from pathlib import Path\n"
        "from trainyard.cli.request import spec_request\n"
        f"spec_request(Path({str(spec)!r}), set_values=[], set_strings=[], set_env=[])"
    )
    assert "jinja2" in loaded


def test_help_and_an_unknown_command_load_every_group() -> None:
    for argv in (["--help"], ["no-such-command"]):
        loaded = _loaded_after(
            f"from trainyard.cli.main import main\nassert main({argv!r}) in (0, 2)"
        )
        assert set(OTHER_GROUPS) | {"trainyard.cli.workflow"} <= loaded, argv


def test_help_and_a_usage_error_import_no_http_client() -> None:
    """They send no request: httpx (its command line, rich and pygments with it), httpcore
    (trio where installed) and the server's process helpers are imported by the first
    request (``cli.client._httpx``), not by importing the groups."""
    for argv in (["--help"], ["workflow", "list", "--no-such-flag"], ["server", "--help"]):
        loaded = _loaded_after(
            f"from trainyard.cli.main import main\nassert main({argv!r}) in (0, 2)"
        )
        assert "trainyard.cli.client" in loaded or argv[0] == "server", argv
        heavy = {"httpx", "httpcore", "trio", "trainyard.server.process", "trainyard.server.auth"}
        assert not loaded & heavy, (argv, sorted(loaded & heavy))


def test_rich_is_imported_at_the_first_print_and_a_progress_bar_gets_a_real_console() -> None:
    loaded = _loaded_after("import trainyard.cli.output")
    assert "rich" not in loaded and "rich.console" not in loaded
    loaded = _loaded_after(
        "from rich.console import Console\n"
        "from trainyard.cli import output\n"
        "output.console.print('[dim]x[/dim]')\n"
        "assert isinstance(output.rich_console(output.err_console), Console)\n"
        "assert output.rich_console(output.err_console) is output.rich_console(output.err_console)"
    )
    assert "rich.console" in loaded
