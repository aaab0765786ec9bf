"""``cli.lean_http.preload_httpx``: httpx and httpcore without httpx's command line and trio,
which import normally afterwards (issue 15)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest


def _run(code: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_preload_skips_httpx_cli_and_trio_and_both_import_afterwards() -> None:
    if importlib.util.find_spec("trio") is None:
        pytest.skip(
            "trio is not installed here (it comes with selenium, a dev dependency): nothing to skip"
        )
    result = _run(
        "import json, sys\n"
        "from trainyard.cli.lean_http import preload_httpx\n"
        "preload_httpx()\n"
        "before = {m: m in sys.modules for m in ('httpx', 'httpcore', 'httpx._main', 'trio')}\n"
        "import httpcore._synchronization as sync\n"
        "httpcore_trio = sync.trio is not None\n"
        "import trio\n"
        "print(json.dumps({'before': before, 'httpcore_trio': httpcore_trio,"
        " 'trio_later': trio.__name__}))"
    )
    assert result["before"] == {
        "httpx": True,
        "httpcore": True,
        "httpx._main": False,
        "trio": False,
    }
    assert result["httpcore_trio"] is False
    assert result["trio_later"] == "trio"


def test_a_process_that_has_httpx_already_is_left_as_it_is() -> None:
    result = _run(
        "import json, sys\n"
        "import httpx\n"
        "had_main = 'httpx._main' in sys.modules\n"
        "from trainyard.cli.lean_http import preload_httpx\n"
        "preload_httpx()\n"
        "print(json.dumps({'had_main': had_main, 'has_main': 'httpx._main' in sys.modules,"
        " 'httpcore': 'httpcore' in sys.modules}))"
    )
    assert result["has_main"] == result["had_main"]
    assert result["httpcore"] is False  # not imported by preload_httpx in such a process
