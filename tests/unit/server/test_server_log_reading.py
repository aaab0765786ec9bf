"""Issue 12 (H6, L1, L2) on the server side: logs are read from file offsets with bounded
memory (``-n`` from the end), streamed, checked before the answer starts, and served with
control characters escaped and the runner's lines told apart in JSON."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import default_local_pool
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry, User
from trainyard.server.logs import MAX_READ_LINE_BYTES, LogFile, read_merged, tail_offset
from trainyard.server.service import Service
from trainyard.store import Store

ECHO = """
workflow:
  name: talk
  tasks:
  - name: a
    command: [echo, a]
  - name: b
    command: [echo, b]
"""
ADMIN = User("admin", admin=True)


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[TestClient, Service, TokenRegistry]]:
    backend = FakeBackend(lambda launch: Outcome(0, polls=2))
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: backend,
    )
    service = Service(engine)
    tokens = TokenRegistry(tmp_path)
    with TestClient(create_app(service, tokens)) as client:
        yield client, service, tokens


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _submit_done(client: TestClient, token: str) -> str:
    wid = client.post("/api/workflow", json={"spec_text": ECHO}, headers=_auth(token)).json()["id"]
    for _ in range(200):
        if client.get(f"/api/workflow/{wid}", headers=_auth(token)).json()["status"] == "COMPLETED":
            return wid
        time.sleep(0.05)
    raise AssertionError(f"{wid} did not complete")


def _log(tmp_path: Path, wid: str, task: str) -> Path:
    path = tmp_path / "runs" / wid / task / "0" / "task.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _line(second: int, task: str, text: str) -> str:
    return f"2026/01/02 03:{second // 60:02d}:{second % 60:02d} [{task}] {text}\n"


# ---------------------------------------------------------------------- L1


def test_follow_of_a_forbidden_or_unknown_workflow_is_refused_before_streaming(served) -> None:
    client, _, tokens = served
    alice, bob = tokens.add("alice"), tokens.add("bob")
    wid = _submit_done(client, alice)
    for follow in (True, False):
        params = {"follow": follow}
        forbidden = client.get(f"/api/workflow/{wid}/logs", params=params, headers=_auth(bob))
        unknown = client.get("/api/workflow/nope-9/logs", params=params, headers=_auth(bob))
        no_task = client.get(
            f"/api/workflow/{wid}/logs", params={**params, "task": "zz"}, headers=_auth(alice)
        )
        assert (forbidden.status_code, forbidden.json()["kind"]) == (403, "ForbiddenError")
        assert (unknown.status_code, unknown.json()["kind"]) == (404, "NotFoundError")
        assert (no_task.status_code, no_task.json()["kind"]) == (404, "NotFoundError")
        assert "has no task 'zz'" in no_task.json()["detail"][0]["message"]


# ---------------------------------------------------------------------- -n and merging


def test_last_lines_of_merged_tasks_equal_the_end_of_the_whole(served, tmp_path: Path) -> None:
    client, _, tokens = served
    token = (tmp_path / "token").read_text().strip()
    wid = _submit_done(client, token)
    _log(tmp_path, wid, "a").write_text("".join(_line(s, "a", f"a{s}") for s in range(0, 40, 2)))
    _log(tmp_path, wid, "b").write_text(
        "".join(_line(s, "b", f"b{s}") for s in range(1, 30, 2))
        + "2026/01/02 03:00:59 [b] no newline yet"
    )
    whole = client.get(f"/api/workflow/{wid}/logs", headers=_auth(token)).text.splitlines()
    assert len(whole) == 20 + 15 + 1 and whole[-1].endswith("[b] no newline yet")
    for count in (1, 3, 7, 35, 36, 100):
        got = client.get(
            f"/api/workflow/{wid}/logs", params={"lines": count}, headers=_auth(token)
        ).text.splitlines()
        assert got == whole[-count:], count
    followed = client.get(
        f"/api/workflow/{wid}/logs", params={"lines": 3, "follow": True}, headers=_auth(token)
    ).text.splitlines()
    assert followed == whole[-3:]  # the workflow ended: its last line counts, newline or not


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(
        st.text(alphabet="ab\n", max_size=5).map(lambda t: t.replace("\n", "")), max_size=12
    ),
    newline_at_end=st.booleans(),
    count=st.integers(1, 15),
    complete_only=st.booleans(),
)
def test_tail_offset_agrees_with_reading_forwards(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[str],
    newline_at_end: bool,
    count: int,
    complete_only: bool,
) -> None:
    path = tmp_path_factory.mktemp("tail") / "task.log"
    data = "\n".join(lines) + ("\n" if newline_at_end and lines else "")
    path.write_text(data)
    every = data.split("\n")
    if every and every[-1] == "":
        every.pop()  # the last line's own newline
    elif complete_only and every:
        every.pop()  # an unfinished last line is no line yet
    offset, found = tail_offset(path, len(data.encode()), count, complete_only=complete_only)
    assert found == min(count, len(every))
    rest = data.encode()[offset:].decode()
    expected = every[-count:] if every else []
    assert rest.split("\n")[: len(expected)] == expected


# ---------------------------------------------------------------------- bounded memory


def _consume_peak(stream: Iterator) -> tuple[int, int]:
    """(lines, peak traced bytes) of reading ``stream`` to its end."""
    tracemalloc.start()
    try:
        count = sum(1 for _ in stream)
        return count, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_a_big_log_holds_a_bounded_batch(served, tmp_path: Path) -> None:
    client, service, _ = served
    token = (tmp_path / "token").read_text().strip()
    wid = _submit_done(client, token)
    line = _line(5, "a", "x" * 70)
    with _log(tmp_path, wid, "a").open("w") as handle:
        for _ in range(40):
            handle.write(line * 5000)  # 40 x 500 KB: 20 MB
    assert _log(tmp_path, wid, "a").stat().st_size == 19_000_000
    every, peak = _consume_peak(service.logs.read(wid, ADMIN))
    assert every == 200_000 and peak < 8_000_000, peak  # 2.7 MB seen; the whole is 19 MB
    last, peak = _consume_peak(service.logs.read(wid, ADMIN, last_lines=2))
    assert last == 2 and peak < 400_000, peak


def test_a_line_too_long_to_serve_is_shown_shortened(served, tmp_path: Path) -> None:
    client, service, _ = served
    token = (tmp_path / "token").read_text().strip()
    wid = _submit_done(client, token)
    huge = "2026/01/02 03:00:01 [a] " + "y" * 3_000_000 + "\n"  # not written by this runner
    _log(tmp_path, wid, "a").write_text(_line(0, "a", "before") + huge + _line(2, "a", "after"))
    lines = list(service.logs.read(wid, ADMIN))
    shown = "y" * (MAX_READ_LINE_BYTES - 24)
    left_out = 3_000_024 - MAX_READ_LINE_BYTES
    assert [l.text[20:] for l in lines] == [
        "[a] before",
        f"[a] {shown} [... {left_out} more bytes of this line not shown]",
        "[a] after",
    ]
    _, peak = _consume_peak(service.logs.read(wid, ADMIN))
    assert peak < 2 * MAX_READ_LINE_BYTES + 1_500_000, peak
    assert [l.text[20:] for l in service.logs.read(wid, ADMIN, last_lines=1)] == ["[a] after"]


# ---------------------------------------------------------------------- L2 when read


def test_lines_are_escaped_and_runner_lines_marked_when_served(served, tmp_path: Path) -> None:
    client, _, _ = served
    token = (tmp_path / "token").read_text().strip()
    wid = _submit_done(client, token)
    _log(tmp_path, wid, "a").write_bytes(  # as an older runner wrote them: raw \r and ESC
        b"2026/01/02 03:00:01 [a] ok\r2020/01/01 00:00:00 [b] forged\n"
        b"2026/01/02 03:00:02 [a] \x1b[2Jcleared\n"
        b"2026/01/02 03:00:03 [a] [trainyard] exit code 0\n"
        b"2026/01/02 03:00:04 [a][cut] aaaa\n"
        b"2026/01/02 03:00:04 [a] bb\n"
        b"2026/01/02 03:00:05 [a][trainyard] exit code 1\n"
    )
    text = client.get(f"/api/workflow/{wid}/logs", params={"task": "a"}, headers=_auth(token)).text
    assert text.splitlines()[:2] == [
        "2026/01/02 03:00:01 [a] ok\\r2020/01/01 00:00:00 [b] forged",
        "2026/01/02 03:00:02 [a] \\x1b[2Jcleared",
    ]
    rows = [
        json.loads(l)
        for l in client.get(
            f"/api/workflow/{wid}/logs",
            params={"task": "a", "format": "json"},
            headers=_auth(token),
        ).text.splitlines()
    ]
    assert [(r["source"], r["cut"], r["line"]) for r in rows] == [
        ("task", False, "ok\\r2020/01/01 00:00:00 [b] forged"),
        ("task", False, "\\x1b[2Jcleared"),
        ("task", False, "[trainyard] exit code 0"),
        ("task", True, "aaaa"),
        ("task", False, "bb"),
        ("runner", False, "[trainyard] exit code 1"),
    ]
    assert {"time", "task", "retry_id", "line"} <= set(rows[0])


# ---------------------------------------------------------------------- follow


def test_follow_waits_for_a_line_to_end_and_reads_only_what_is_new(tmp_path: Path) -> None:
    path = tmp_path / "task.log"
    path.write_text(_line(0, "a", "one") + "2026/01/02 03:00:01 [a] tw")
    log = LogFile("a", 0, path)
    first = [l.text for l in read_merged([log], {path: path.stat().st_size}, follow=True)]
    assert first == ["2026/01/02 03:00:00 [a] one"]
    with path.open("a") as handle:
        handle.write("o\n" + _line(2, "a", "three"))
    again = [l.text for l in read_merged([log], {path: path.stat().st_size}, follow=True)]
    assert again == ["2026/01/02 03:00:01 [a] two", "2026/01/02 03:00:02 [a] three"]


def test_follow_of_an_ended_workflow_gives_what_is_there_and_ends(served, tmp_path: Path) -> None:
    client, service, _ = served
    wid = _submit_done(client, (tmp_path / "token").read_text().strip())
    _log(tmp_path, wid, "a").write_text(_line(0, "a", "old") + "2026/01/02 03:00:01 [a] last")
    seen: list[str] = []
    ended = threading.Event()

    def follow() -> None:
        seen.extend(
            line.text[20:]
            for line in service.logs.follow(wid, ADMIN, task="a", poll_s=0.05)
            if line
        )
        ended.set()

    threading.Thread(target=follow, daemon=True).start()
    assert ended.wait(10), "follow of an ended workflow did not end"
    assert seen == ["[a] old", "[a] last"]


def test_answers_go_out_in_chunks_and_at_once_before_a_follow_waits() -> None:
    from trainyard.server.app import LOG_CHUNK_BYTES, _log_chunks
    from trainyard.server.logs import FLUSH, LogLine

    line = LogLine("a", 0, "2026/01/02 03:00:00 [a] " + "z" * 999)  # 1,024 bytes with newline
    chunks = list(_log_chunks(iter([line] * 200), "text"))
    assert [len(c) for c in chunks] == [LOG_CHUNK_BYTES] * 3 + [200 * 1024 - 3 * LOG_CHUNK_BYTES]
    waits = list(_log_chunks(iter([line, FLUSH, FLUSH, line, line]), "json"))
    assert [c.count("\n") for c in waits] == [1, 2]
    assert json.loads(waits[0])["line"] == "z" * 999
