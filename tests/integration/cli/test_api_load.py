"""A small, untimed version of bench/api_load.py against the session's server: 20 concurrent
submissions through the API are all accepted and all complete."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
from cli_e2e_support import Server

BENCH = Path(__file__).resolve().parents[3] / "bench" / "api_load.py"


def load_bench():  # noqa: ANN201 - the bench module
    spec = importlib.util.spec_from_file_location("trainyard_bench_api_load", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_twenty_concurrent_submissions_are_accepted_and_complete(server: Server) -> None:
    bench = load_bench()
    count = 20
    with httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=120,
        limits=httpx.Limits(max_connections=count),
    ) as client:
        results = bench.submit_concurrently(client, count)
        assert [r.status_code for _, r in results] == [200] * count, [r.text for _, r in results]
        ids = {r.json()["id"] for _, r in results}
        assert len(ids) == count  # every submission got its own workflow
        status = bench.wait_all_terminal(client, ids, timeout_s=240)
    assert set(status.values()) == {"COMPLETED"}, status
