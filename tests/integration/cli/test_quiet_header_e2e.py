"""Quiet task headers (issue 28), through the real CLI, the real server and a real task: a
task's log starts with one short line; ``workflow logs --verbose`` and ``workflow query
--verbose`` show the isolation detail (sandbox, network, image) that used to open every log."""

from __future__ import annotations

from pathlib import Path

from cli_e2e_support import Server

SPEC = (
    "workflow:\n  name: quiet-header\n  tasks:\n  - name: t\n    image: ubuntu:22.04\n"
    "    command: [echo, hello-from-t]\n"
)


def _submitted(server: Server, tmp_path: Path) -> str:
    spec = tmp_path / "quiet.yaml"
    spec.write_text(SPEC)
    workflow_id = server.submit(spec)
    assert server.wait(workflow_id)["status"] == "COMPLETED"
    return workflow_id


def test_a_task_log_starts_with_one_short_line_and_verbose_shows_the_detail(
    server: Server, tmp_path: Path
) -> None:
    workflow_id = _submitted(server, tmp_path)
    quiet = server.logs(workflow_id, "--no-follow")
    lines = quiet.splitlines()
    head = lines[: next(i for i, line in enumerate(lines) if line.endswith("[t] hello-from-t"))]
    assert len(head) == 1, quiet  # the header, then the command's output
    assert "[t][trainyard] workflow " in head[0] and len(head[0]) < 250, head[0]
    assert "NOT run" not in quiet and "[detail]" not in quiet, quiet
    loud = server.logs(workflow_id, "--no-follow", "--verbose")
    detail = [line for line in loud.splitlines() if "[t][detail] " in line]
    assert detail and any("backend" in line for line in detail), loud


def test_query_verbose_shows_how_each_task_is_isolated(server: Server, tmp_path: Path) -> None:
    workflow_id = _submitted(server, tmp_path)
    assert "isolation" not in server.query(workflow_id)["groups"][0]["tasks"][0]
    task = server.query(workflow_id, verbose=True)["groups"][0]["tasks"][0]
    assert task["isolation"] and "backend" in task["isolation"][0], task
    text = server.main("workflow", "query", workflow_id, "--verbose")
    assert text.code == 0, text.err
    assert "Isolation of t retry 0:" in text.out and task["isolation"][0][:40] in text.out


def test_logs_n_counts_the_lines_it_shows(server: Server, tmp_path: Path) -> None:
    """``logs -n N`` shows N lines (the hidden detail lines do not count); with
    ``--verbose`` the detail lines are shown and count."""
    workflow_id = _submitted(server, tmp_path)
    quiet = server.logs(workflow_id, "--no-follow").splitlines()
    loud = server.logs(workflow_id, "--no-follow", "--verbose").splitlines()
    assert len(loud) > len(quiet) >= 2, (quiet, loud)
    for count in range(1, len(quiet) + 1):
        shown = server.logs(workflow_id, "--no-follow", "-n", str(count)).splitlines()
        assert shown == quiet[-count:], (count, shown)
    everything = server.logs(workflow_id, "--no-follow", "-n", str(len(loud))).splitlines()
    assert everything == quiet
    last = server.logs(workflow_id, "--no-follow", "--verbose", "-n", str(len(loud) - 1))
    assert last.splitlines() == loud[1:]
