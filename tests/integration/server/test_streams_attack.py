"""Issue 24, "the API stops for everyone": log followers and dashboard log streams must not
take the server's threads. The attacks as they were seen, against a real server over real
HTTP: many ``logs?follow=true`` on a quiet task with a task token, SSE streams of
``lines=100000`` on a task that prints fast; ``/api/health`` must answer within 1 s
throughout and the synchronous routes (a query) must still answer. Past the per-user cap a
new stream is refused with 429 before it starts."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from conftest import CHATTY, QUIET, Live

FOLLOWERS = 60
"""More than the server's 40 worker threads: 45 hung every endpoint before issue 24."""
SSE_STREAMS = 10


@contextmanager
def open_streams(live: Live, path: str, token: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` raw HTTP GETs of ``path`` left open (the test holds no thread per stream)."""
    where = urlsplit(live.url)
    socks = []
    try:
        for _ in range(count):
            sock = socket.create_connection((where.hostname, where.port), timeout=30)
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
                f"Authorization: Bearer {token}\r\n\r\n".encode()
            )
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def read_until(sock: socket.socket, marker: bytes, timeout_s: float = 20.0) -> bytes:
    """What ``sock`` received until ``marker`` came (or ``timeout_s`` passed, or the peer
    closed): a stream's head and first event can come in separate reads."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while marker not in got and time.monotonic() < deadline:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    return got


def health_s(live: Live, timeout_s: float = 10.0) -> float:
    """Seconds for one ``GET /api/health`` on a new connection, connect to last byte, over a
    raw socket (an httpx client made per call costs more than the server's answer on a
    loaded machine); ``timeout_s`` when it took longer."""
    where = urlsplit(live.url)
    start = time.monotonic()
    try:
        with socket.create_connection((where.hostname, where.port), timeout=timeout_s) as sock:
            sock.sendall(
                f"GET /api/health HTTP/1.1\r\nHost: {where.netloc}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except TimeoutError:
        return timeout_s
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    return time.monotonic() - start


def timed_health(live: Live, seconds: float) -> list[float]:
    """Latencies of ``/api/health`` asked every 0.1 s for ``seconds``."""
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        latencies.append(health_s(live))
        time.sleep(0.1)
    return latencies


def timed(live: Live, path: str, seconds: float) -> list[float]:
    """Latencies of GET ``path`` (with the admin's token) asked again and again for
    ``seconds``, a new httpx client each, as a new CLI would; a timeout counts as 10 s."""
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.monotonic()
        try:
            answer = httpx.get(
                live.url + path, timeout=10, headers={"Authorization": f"Bearer {live.token}"}
            )
            assert answer.status_code == 200, answer.text
        except httpx.TimeoutException:
            pass
        latencies.append(time.monotonic() - start)
        time.sleep(0.1)
    return latencies


def test_sixty_followers_of_a_quiet_task_leave_health_and_queries_answering(live: Live) -> None:
    wid = live.submit(QUIET)
    live.wait_running(wid)
    path = f"/api/workflow/{wid}/logs?follow=true"
    with open_streams(live, path, live.task_token(wid), FOLLOWERS) as socks:
        time.sleep(2)  # every follow has started and waits
        health = timed_health(live, 5)
        query = timed(live, f"/api/workflow/{wid}", 3)
        first = socks[-1].recv(4096)
    assert max(health) < 1.0, f"health took up to {max(health):.2f} s"
    assert max(query) < 2.0, f"a query took up to {max(query):.2f} s"
    assert first.startswith(b"HTTP/1.1 200") and b"started" in first, first[:300]


def test_ten_sse_streams_of_a_fast_printing_task_leave_health_answering(live: Live) -> None:
    wid = live.submit(CHATTY)
    live.wait_running(wid)
    time.sleep(3)  # a log of many lines already, growing fast
    path = f"/workflows/{wid}/logs/stream?lines=100000"
    with open_streams(live, path, live.token, SSE_STREAMS) as socks:
        health = timed_health(live, 8)
        got = [read_until(sock, b"data: ") for sock in socks]
    assert max(health) < 1.0, f"health took up to {max(health):.2f} s"
    late = [g[:300] for g in got if b"text/event-stream" not in g or b"data: " not in g]
    assert not late, late


def test_streams_past_the_per_user_cap_are_refused_with_429(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    capped = Live(home, {"TRAINYARD_MAX_STREAMS_PER_USER": "3"})
    try:
        wid = capped.submit(QUIET)
        capped.wait_running(wid)
        path = f"/api/workflow/{wid}/logs?follow=true"
        with open_streams(capped, path, capped.task_token(wid), 3) as socks:
            assert all(s.recv(64).startswith(b"HTTP/1.1 200") for s in socks)
            refused = capped.api("GET", path, capped.task_token(wid))
            assert refused.status_code == 429 and refused.json()["kind"] == "TooBusyError"
            page = capped.api("GET", f"/workflows/{wid}/logs/stream")  # the same user
            assert page.status_code == 429, page.text
        deadline = time.monotonic() + 10  # the closed streams give their slots back
        while True:
            with httpx.stream(
                "GET",
                capped.url + path,
                timeout=30,
                headers={"Authorization": f"Bearer {capped.token}"},
            ) as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline, "the closed streams kept their slots"
            time.sleep(0.2)
    finally:
        capped.stop()


COUNTED = """
workflow:
  name: counted
  tasks:
  - name: t
    command: [sh, -c, "sleep 2; i=0; while [ $i -lt 20000 ]; do echo n $i; i=$((i+1)); done; sleep 1"]
"""


def test_many_followers_each_get_every_line_once_and_a_slow_one_holds_nobody(live: Live) -> None:
    """Followers of one task share one reader (``streams.LogFeed``); what each gets is all
    the task printed, once and in order, whether it came early or late, and one client that
    reads nothing for a while (its socket full) neither holds the others nor loses a line."""
    import asyncio

    wid = live.submit(COUNTED)
    live.wait_running(wid)
    path = f"{live.url}/api/workflow/{wid}/logs?follow=true"
    headers = {"Authorization": f"Bearer {live.task_token(wid)}"}
    followers = 30

    async def follow(client: httpx.AsyncClient, pause: asyncio.Event | None) -> list[str]:
        async with client.stream("GET", path, headers=headers) as answer:
            assert answer.status_code == 200
            if pause is not None:
                await pause.wait()
            text = "".join([chunk async for chunk in answer.aiter_text()])
        return [ln.split("] ", 1)[1] for ln in text.splitlines() if "] n " in ln]

    async def everyone() -> tuple[list[list[str]], list[str]]:
        others_done = asyncio.Event()
        timeout = httpx.Timeout(300, connect=30)
        async with httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_connections=followers + 1)
        ) as client:
            slow = asyncio.ensure_future(follow(client, others_done))
            got = await asyncio.gather(*(follow(client, None) for _ in range(followers)))
            others_done.set()
            return list(got), await slow

    got, slow = asyncio.run(everyone())
    expected = [f"n {i}" for i in range(20000)]
    assert all(lines == expected for lines in got), [len(lines) for lines in got]
    assert slow == expected, len(slow)
    assert live.wait_ended(wid) == "COMPLETED"
