"""Quiet task headers (issue 28): a task log starts with one short line (node, isolation,
image); the backend's long isolation detail is kept in the log as ``[task][detail]`` lines,
which ``workflow logs`` shows only with ``--verbose``."""

from __future__ import annotations

from pathlib import Path

from runner_support import MakeRun, execute, log_text

from trainyard.runner.report import parse_line
from trainyard.server.logs import LogFile, read_merged, tail_offset

LONG = (
    "local backend on local-0: bubblewrap sandbox (own writable /, pid/ipc/uts/user "
    "namespaces, no capabilities, root inside is the host's nobody); network namespace of "
    "the group, egress through pasta; address 127.0.0.5\nimage ubuntu:22.04 is NOT run: this "
    "pool runs no images (images: podman in pools.yaml runs them); the host's tools run instead"
)
SUMMARY = "local-0, bubblewrap sandbox, host tools (image ubuntu:22.04 not run: no image runtime on this pool)"


def _runner_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "[t1][trainyard] " in line]


def test_the_log_starts_with_one_short_header_line(make_run: MakeRun) -> None:
    run = make_run(
        script="echo hi\n",
        image="ubuntu:22.04",
        sandbox={"root": None, "description": LONG, "summary": SUMMARY},
    )
    run.sandbox.root = str(Path(run.run_dir) / "root")
    assert execute(run) == 0
    text = log_text(run)
    before_output = text.split("[t1] hi")[0]
    header = _runner_lines(before_output)
    assert len(header) == 1, before_output
    assert SUMMARY in header[0] and len(header[0]) < 250, header[0]
    assert "NOT run" not in header[0]


def test_the_detail_is_kept_as_detail_lines(make_run: MakeRun) -> None:
    run = make_run(script="echo hi\n", sandbox={"description": LONG, "summary": SUMMARY})
    run.sandbox.root = str(Path(run.run_dir) / "root")
    assert execute(run) == 0
    parts = [parse_line(line, "t1") for line in log_text(run).splitlines()]
    detail = [p.text for p in parts if p.source == "detail"]
    assert [d.removeprefix("[detail] ") for d in detail] == LONG.splitlines()


def test_a_task_cannot_print_a_detail_line(make_run: MakeRun) -> None:
    run = make_run(script="echo '[detail] forged'\n")
    assert execute(run) == 0
    parts = [parse_line(line, "t1") for line in log_text(run).splitlines()]
    assert not [p for p in parts if p.source == "detail"]
    assert any(p.source == "task" and p.text == "[detail] forged" for p in parts)


def test_log_readers_hide_detail_lines_unless_verbose(tmp_path: Path) -> None:
    log = tmp_path / "task.log"
    log.write_text(
        "2026/11/27 01:00:00 [t1][trainyard] workflow wf task t1 retry 0: local-0\n"
        "2026/11/27 01:00:00 [t1][detail] local backend on local-0: long words\n"
        "2026/11/27 01:00:01 [t1] [detail] printed by the task\n"
    )
    ends = {log: log.stat().st_size}
    quiet = [
        line.text
        for line in read_merged([LogFile("t1", 0, log, hide_detail=True)], ends, follow=False)
    ]
    full = [line.text for line in read_merged([LogFile("t1", 0, log)], ends, follow=False)]
    assert len(quiet) == 2 and not any("long words" in t for t in quiet), quiet
    assert len(full) == 3


def test_the_last_lines_count_only_the_lines_shown(tmp_path: Path) -> None:
    """``logs -n N`` without ``--verbose``: the hidden detail lines do not count toward N,
    also across the backward reader's blocks."""
    log = tmp_path / "task.log"
    head = "2026/11/27 01:00:00 [t1][trainyard] workflow wf task t1 retry 0: local-0\n"
    detail = "".join(
        f"2026/11/27 01:00:00 [t1][detail] detail {i} {'x' * 3000}\n" for i in range(40)
    )
    body = "".join(f"2026/11/27 01:00:01 [t1] out {i}\n" for i in range(3))
    log.write_text(head + detail + body)
    end = log.stat().st_size
    for count in (1, 3, 4, 10):
        offset, lines = tail_offset(log, end, count, hide_task="t1")
        shown = [
            line.text
            for line in read_merged(
                [LogFile("t1", 0, log, offset=offset, hide_detail=True)], {log: end}, follow=False
            )
        ]
        assert lines == len(shown) == min(count, 4), (count, lines, shown)
        assert shown[-1].endswith("out 2")
    offset, lines = tail_offset(log, end, 4)
    assert lines == 4 and "out 0" in log.read_bytes()[offset:].decode().splitlines()[-3]
