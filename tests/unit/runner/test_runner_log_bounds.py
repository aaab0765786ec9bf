"""Issue 12 (H6, L2, H3) on the runner side: a task's output line is cut at 64 KiB and marked,
the pump holds a bounded buffer, control characters are escaped, the runner's own lines
cannot be imitated, and a task log that cannot be written ends the attempt (2022)."""

from __future__ import annotations

import errno
import io
import os
import re
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from runner_support import MakeRun, event_kinds, execute, log_text, write_run_json

from trainyard.runner.command import CommandProcess, read_pieces
from trainyard.runner.report import (
    MAX_LINE_BYTES,
    RESERVE,
    TaskLog,
    escape_control,
    parse_line,
    read_events,
)

STAMP = r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d"


# ---------------------------------------------------------------------- pieces


def test_read_pieces_cuts_long_lines_and_keeps_short_ones() -> None:
    data = b"short\n" + b"a" * 25 + b"\n" + b"b" * 20 + b"\nno newline at the end"
    pieces = list(read_pieces(io.BufferedReader(io.BytesIO(data)), 10))
    assert pieces == [
        ("short\n", False),
        ("a" * 10, True),
        ("a" * 10, True),
        ("aaaaa\n", False),
        ("b" * 10, True),
        ("b" * 10, True),
        ("\n", False),
        ("no newline", True),
        (" at the en", True),
        ("d", False),
    ]


def test_read_pieces_never_splits_a_character() -> None:
    data = ("é" * 7 + "\n").encode()  # 15 bytes (2-byte characters), cut every 5 bytes
    pieces = list(read_pieces(io.BufferedReader(io.BytesIO(data)), 5))
    assert "".join(text for text, _ in pieces) == "é" * 7 + "\n"
    assert "\ufffd" not in "".join(text for text, _ in pieces)
    assert [cut for _, cut in pieces] == [True, True, False]


# ---------------------------------------------------------------------- escaping


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text\twith a tab", "plain text\twith a tab"),
        ("a\rb", "a\\rb"),
        ("line\nbreak", "line\\nbreak"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("nul\x00 bell\x07 del\x7f c1\x9b", "nul\\x00 bell\\x07 del\\x7f c1\\x9b"),
        ("sep\u2028par\u2029rlo\u202eiso\u2066", "sep\\u2028par\\u2029rlo\\u202eiso\\u2066"),
        ("back\\slash and \\r typed", "back\\slash and \\r typed"),
    ],
)
def test_escape_control(raw: str, shown: str) -> None:
    assert escape_control(raw) == shown
    assert escape_control(shown) == shown  # escaping twice changes nothing


def test_parse_line_tells_the_runner_from_the_task() -> None:
    task = parse_line("2026/01/02 03:04:05 [t1] [trainyard] exit code 0", "t1")
    runner = parse_line("2026/01/02 03:04:05 [t1][trainyard] exit code 0", "t1")
    cut = parse_line("2026/01/02 03:04:05 [t1][cut] aaaa", "t1")
    other = parse_line("no stamp at all", "t1")
    assert (task.source, task.text, task.cut) == ("task", "[trainyard] exit code 0", False)
    assert (runner.source, runner.text, runner.cut) == ("runner", "[trainyard] exit code 0", False)
    assert (cut.source, cut.text, cut.cut) == ("task", "aaaa", True)
    assert (other.stamp, other.source, other.text) == (None, "task", "no stamp at all")


# ---------------------------------------------------------------------- the runner's log


def test_a_long_line_without_newline_is_written_as_marked_pieces(make_run: MakeRun) -> None:
    size = 3 * MAX_LINE_BYTES + 3392
    run = make_run(script=f"head -c {size} /dev/zero | tr '\\0' a; echo; echo done")
    assert execute(run) == 0
    lines = log_text(run).splitlines()
    body = [l for l in lines if "[t1][trainyard]" not in l]
    assert [re.sub(r"a+", "A", l[20:]) for l in body] == [
        "[t1][cut] A",
        "[t1][cut] A",
        "[t1][cut] A",
        "[t1] A",
        "[t1] done",
    ]
    pieces = [parse_line(l, "t1") for l in body[:4]]
    assert [len(p.text) for p in pieces] == [MAX_LINE_BYTES] * 3 + [3392]
    assert "".join(p.text for p in pieces) == "a" * size


def test_task_output_cannot_forge_lines_or_the_runners_own(make_run: MakeRun) -> None:
    script = (
        "printf 'ok\\r2020/01/01 00:00:00 [other] forged\\n'; "
        "printf '\\033[31mred\\033[0m\\n'; "
        "printf 'two\\013lines\\0342\\n'; "
        "echo '[trainyard] exit code 0'; exit 3"
    )
    run = make_run(script=script)
    assert execute(run) == 3
    lines = log_text(run).splitlines()
    task_lines = [l[20:] for l in lines if not l[20:].startswith("[t1][trainyard]")]
    assert task_lines == [
        "[t1] ok\\r2020/01/01 00:00:00 [other] forged",
        "[t1] \\x1b[31mred\\x1b[0m",
        "[t1] two\\x0blines\\x1c2",
        "[t1] [trainyard] exit code 0",
    ]
    assert all(re.match(STAMP + r" \[t1\]", l) for l in lines)
    sources = [(parse_line(l, "t1").source, parse_line(l, "t1").text) for l in lines]
    assert ("task", "[trainyard] exit code 0") in sources
    assert sources[-1] == ("runner", "[trainyard] exit code 3")
    assert not any(c in log_text(run).replace("\n", "") for c in "\r\x1b\x0b\x1c")


def test_the_reserve_is_given_back_when_the_attempt_ends(make_run: MakeRun) -> None:
    run = make_run(script="echo hi")
    assert execute(run) == 0
    assert not (Path(run.run_dir) / RESERVE).exists()


# ---------------------------------------------------------------------- bounded memory


def test_the_pump_holds_one_piece_of_a_20_mb_line() -> None:
    got = {"bytes": 0, "pieces": 0, "cut": 0}

    def count(text: str, cut: bool) -> None:
        got["bytes"] += len(text)
        got["pieces"] += 1
        got["cut"] += cut

    command = CommandProcess(
        ["sh", "-c", "head -c 20000000 /dev/zero; echo"], dict(os.environ), "/", count
    )
    tracemalloc.start()
    try:
        command.start()
        assert command.wait() == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got["bytes"] == 20_000_001
    assert got["pieces"] == -(-20_000_001 // MAX_LINE_BYTES) and got["cut"] == got["pieces"] - 1
    assert peak < 1_000_000, f"the pump held {peak} bytes at once"


def test_a_runner_process_printing_a_32_mb_line_stays_small(
    make_run: MakeRun, tmp_path: Path
) -> None:
    """A real runner process (``python -m trainyard.runner``); its peak RSS is read by a
    parent of its own, whose only child it is (``ru_maxrss`` of the waited children)."""
    run = make_run(script="head -c 33554432 /dev/zero | tr '\\0' a; echo")
    run_json = write_run_json(run)
    measure = (
        "import resource, subprocess, sys; "
        "code = subprocess.call([sys.executable, '-m', 'trainyard.runner', sys.argv[1]]); "
        "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", measure, str(run_json)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    code, peak_kib = map(int, done.stdout.split())
    assert code == 0, log_text(run)[-2000:]
    assert log_text(run).count("[t1][cut] ") == 32 * 1024 * 1024 // MAX_LINE_BYTES
    # The runner is ~33 MiB; holding the line whole took 161 MiB (measured before the fix).
    assert peak_kib < 100 * 1024, f"runner peak RSS {peak_kib} KiB"


# ---------------------------------------------------------------------- disk full


def test_a_log_that_cannot_be_written_ends_the_attempt_with_2022(make_run: MakeRun) -> None:
    """``task.log`` is a link to /dev/full (every write: ENOSPC); the command prints forever."""
    run = make_run(script="while :; do echo spam spam spam; done")
    Path(run.run_dir).mkdir(parents=True)
    (Path(run.run_dir) / "task.log").symlink_to("/dev/full")
    started = time.monotonic()
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(execute(run)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert done == [2022], "the runner hung on a log it cannot write"
    assert time.monotonic() - started < 60
    assert event_kinds(run) == [("INITIALIZING", None), ("EXITED", 2022)]
    events, _ = read_events(Path(run.run_dir) / "events.jsonl")
    assert events[-1].message.startswith("cannot write the task log ")
    assert "No space left on device" in events[-1].message


def test_a_failed_write_is_reported_once_and_later_output_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "task.log").symlink_to("/dev/full")
    failures: list[OSError] = []
    log = TaskLog(tmp_path, "t1", on_failure=failures.append)
    for _ in range(3):
        log.command("output\n")
    log.runner("still tried")
    log.close()
    assert [f.errno for f in failures] == [28]
    assert log.dropped_lines == 2


def test_a_torn_line_is_ended_before_the_next_one(tmp_path: Path) -> None:
    log = TaskLog(tmp_path, "t1")
    log._torn = True  # a write that ran out of space half-way (left by ENOSPC)
    log.command("next\n")
    log.close()
    assert (tmp_path / "task.log").read_text().startswith("\n")


def test_a_line_cut_short_by_a_full_disk_leaves_no_fragment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills half-way through a line: the bytes that made it are cut off again, so
    the log holds whole lines only (a bare ``2026/`` would have no time and no task)."""
    log = TaskLog(tmp_path, "t1")
    log.command("whole\n")
    real_write = os.write
    calls: list[int] = []

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    log.command("lost to the full disk\n")
    monkeypatch.setattr(os, "write", real_write)
    log.runner("after")
    log.close()
    lines = (tmp_path / "task.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["[t1] whole", "[t1][trainyard] after"]
    assert log.failure is not None and log.failure.errno == errno.ENOSPC
