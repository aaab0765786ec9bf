"""events.jsonl and task.log formats."""

from __future__ import annotations

import re
from pathlib import Path

from trainyard.runner.report import EventWriter, TaskLog, format_line, read_events

LINE = re.compile(
    r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} \[(?P<tag>[^\]]+(?:\]\[trainyard)?)\] (?P<text>.*)$"
)


def test_format_line_is_osmo_format_in_utc() -> None:
    assert format_line("task1", "hello", when=0) == "1970/01/01 00:00:00 [task1] hello"


def test_task_log_tags_runner_lines(tmp_path: Path) -> None:
    log = TaskLog(tmp_path, "server")
    log.command("from the command\n")
    log.runner("from the runner")
    log.close()
    lines = (tmp_path / "task.log").read_text().splitlines()
    assert [LINE.match(l).group("tag") for l in lines] == ["server", "server][trainyard"]
    assert lines[0].endswith("[server] from the command")
    assert lines[1].endswith("[server][trainyard] from the runner")


def test_read_events_leaves_partial_line_for_later(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path)
    writer.emit("INITIALIZING")
    writer.emit("EXITED", exit_code=3, message="m")
    with open(tmp_path / "events.jsonl", "a") as handle:
        handle.write('{"kind": "RUN')
    events, offset = read_events(tmp_path / "events.jsonl")
    assert [(e.kind, e.exit_code, e.message) for e in events] == [
        ("INITIALIZING", None, ""),
        ("EXITED", 3, "m"),
    ]
    with open(tmp_path / "events.jsonl", "a") as handle:
        handle.write('NING", "time_s": 1.0}\nnot json\n')
    more, _ = read_events(tmp_path / "events.jsonl", offset)
    assert [e.kind for e in more] == ["RUNNING"]


def test_read_events_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_events(tmp_path / "nope.jsonl", 7) == ([], 7)
