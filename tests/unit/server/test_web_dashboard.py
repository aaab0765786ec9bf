"""The dashboard's pages in-process (FastAPI TestClient) over the fake backend: auth and
sessions, CSRF, filters and paging, escaping of what tasks and specs write, metrics JSON."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import default_local_pool
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.service import Service
from trainyard.server.web import SESSION_COOKIE
from trainyard.store import Store

EVIL = "<script>alert('x')</script><img src=x onerror=alert(1)>"

SPEC = """
workflow:
  name: {name}
  tasks:
  - name: hello
    image: ubuntu:24.04
    command: ["echo"]
    args: ["{arg}"]  # a comment {evil}
"""


class Env:
    def __init__(self, client: TestClient, tokens: TokenRegistry, home: Path, engine: Engine):
        self.client, self.tokens, self.home, self.engine = client, tokens, home, engine
        self.admin = (home / "token").read_text().strip()

    def bearer(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.admin}"}

    def submit(
        self,
        name: str = "hello",
        token: str | None = None,
        arg: str = "hi",
        labels: dict[str, str] | None = None,
    ) -> str:
        body = {"spec_text": SPEC.format(name=name, arg=arg, evil=EVIL), "labels": labels or {}}
        answer = self.client.post("/api/workflow", json=body, headers=self.bearer(token))
        assert answer.status_code == 200, answer.text
        return answer.json()["id"]

    def wait_done(self, wid: str) -> str:
        for _ in range(400):
            status = self.client.get(f"/api/workflow/{wid}", headers=self.bearer()).json()["status"]
            if status == "COMPLETED" or status.startswith("FAILED"):
                return status
            time.sleep(0.05)
        raise AssertionError(f"{wid} did not end")

    def login(self) -> None:
        answer = self.client.post(
            "/login", data={"token": self.admin, "next": "/"}, follow_redirects=False
        )
        assert answer.status_code == 303


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[Env]:
    backend = FakeBackend(lambda launch: Outcome(0, polls=2))
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: backend,
    )
    tokens = TokenRegistry(tmp_path)
    with TestClient(create_app(Service(engine), tokens)) as client:
        yield Env(client, tokens, tmp_path, engine)


def _csrf(html: str) -> str:
    marker = 'name="csrf" value="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]


# ------------------------------------------------------------------ auth


@pytest.mark.parametrize(
    "path", ["/", "/pools", "/datasets", "/workflows/x-1", "/workflows/x-1/logs", "/compare"]
)
def test_a_page_without_session_redirects_to_login(env: Env, path: str) -> None:
    answer = env.client.get(path, follow_redirects=False)
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/login?next=")


def test_login_with_a_wrong_token_is_refused_and_sets_no_cookie(env: Env) -> None:
    answer = env.client.post("/login", data={"token": "nope"}, follow_redirects=False)
    assert answer.status_code == 401
    assert "unknown token" in answer.text
    assert SESSION_COOKIE not in answer.cookies


def test_login_sets_an_httponly_strict_session_and_goes_to_next(env: Env) -> None:
    answer = env.client.post(
        "/login", data={"token": env.admin, "next": "/pools"}, follow_redirects=False
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/pools"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert env.admin not in answer.headers["set-cookie"]  # the cookie holds no token
    assert env.client.get("/pools").status_code == 200


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "\\\\evil"])
def test_login_never_redirects_off_site(env: Env, target: str) -> None:
    answer = env.client.post(
        "/login", data={"token": env.admin, "next": target}, follow_redirects=False
    )
    assert answer.headers["location"] == "/"


def test_bearer_token_works_for_pages(env: Env) -> None:
    assert env.client.get("/", headers=env.bearer()).status_code == 200
    assert env.client.get("/", headers=env.bearer("bad")).status_code == 401


def test_a_removed_token_ends_its_session(env: Env) -> None:
    token = env.tokens.add("bob")
    env.client.post("/login", data={"token": token}, follow_redirects=False)
    assert env.client.get("/").status_code == 200
    data = json.loads((env.home / "tokens.json").read_text())
    del data[token]
    (env.home / "tokens.json").write_text(json.dumps(data))
    assert env.client.get("/", follow_redirects=False).status_code == 303


def test_logout_ends_the_session(env: Env) -> None:
    env.login()
    csrf = _csrf(env.client.get("/").text)
    env.client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert env.client.get("/", follow_redirects=False).status_code == 303


def test_cancel_with_a_session_needs_the_csrf_token(env: Env) -> None:
    wid = env.submit()
    env.wait_done(wid)
    env.login()
    assert (
        env.client.post(f"/workflows/{wid}/cancel", data={}, follow_redirects=False).status_code
        == 401
    )
    assert (
        env.client.post(
            f"/workflows/{wid}/cancel", data={"csrf": "forged"}, follow_redirects=False
        ).status_code
        == 401
    )
    csrf = _csrf(env.client.get(f"/workflows/{wid}").text)
    answer = env.client.post(f"/workflows/{wid}/cancel", data={"csrf": csrf})
    assert answer.status_code == 200 and "workflow" in answer.text


def test_cancel_from_the_page_cancels_a_running_workflow(tmp_path: Path) -> None:
    backend = FakeBackend(lambda launch: Outcome(0, polls=100_000))
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: backend,
    )
    with TestClient(create_app(Service(engine), TokenRegistry(tmp_path))) as client:
        env = Env(client, TokenRegistry(tmp_path), tmp_path, engine)
        wid = env.submit()
        env.login()
        csrf = _csrf(client.get(f"/workflows/{wid}").text)
        answer = client.post(f"/workflows/{wid}/cancel", data={"csrf": csrf})
        assert "cancel requested" in answer.text
        assert env.wait_done(wid) == "FAILED_CANCELED"


def test_another_users_workflow_is_forbidden(env: Env) -> None:
    wid = env.submit()
    bob = env.tokens.add("bob")
    assert env.client.get(f"/workflows/{wid}", headers=env.bearer(bob)).status_code == 403
    assert (
        env.client.get(f"/api/workflow/{wid}/metrics", headers=env.bearer(bob)).status_code == 403
    )


# ------------------------------------------------------------------ list


def _ids_on(html: str) -> list[str]:
    return [part.split('"', 1)[0] for part in html.split('class="wf-link" href="/workflows/')[1:]]


def test_list_pages_newest_first(env: Env) -> None:
    ids = [env.submit(f"w{i}") for i in range(7)]
    first = env.client.get("/?per_page=25&page=1", headers=env.bearer()).text
    assert _ids_on(first) == ids[::-1]
    page1 = env.client.get("/?per_page=5", headers=env.bearer()).text
    page2 = env.client.get("/?per_page=5&page=2", headers=env.bearer()).text
    assert _ids_on(page1) == ids[::-1][:5] and _ids_on(page2) == ids[::-1][5:]
    assert "7 workflows" in page1 and "page 1 of 2" in page1 and 'rel="next"' in page1


def test_list_gives_queue_and_run_time_apart(env: Env) -> None:
    """Issue 28: the list's one duration held queue time and run time without saying so."""
    wid = env.submit()
    env.wait_done(wid)
    html = env.client.get("/", headers=env.bearer()).text
    assert ">Queued</th>" in html and ">Ran</th>" in html and "Total" not in html
    row = html[html.index(f'value="{wid}"') :]
    row = row[: row.index("</tr>")]
    assert re.search(r'<td class="queued">\d+s</td>', row), row
    assert re.search(r'<td class="ran">\d+s</td>', row), row
    # Ended workflows' times are kept: the next refresh reads no stored state for them.
    calls = []
    state = env.engine.state
    env.engine.state = lambda workflow_id: calls.append(workflow_id) or state(workflow_id)
    assert ">Queued</th>" in env.client.get("/", headers=env.bearer()).text
    assert calls == []


def test_compare_settings_table_has_a_column_per_run(env: Env) -> None:
    first, second = env.submit(arg="a", labels={"try": "1"}), env.submit(arg="b")
    env.wait_done(first), env.wait_done(second)
    html = env.client.get(f"/compare?id={first}&id={second}", headers=env.bearer()).text
    table = html[html.index('id="diff-settings"') :]
    table = table[: table.index("</table>")]
    assert f"<th>{first}</th><th>{second}</th>" in table
    assert '<tr class="differs"><td>label.try</td><td>1</td><td>-</td></tr>' in table


def test_list_filters_by_status_user_pool_label_and_name(env: Env) -> None:
    bob = env.tokens.add("bob")
    mine = env.submit("mine", labels={"team": "a"})
    env.submit("other", labels={"team": "b"})
    bobs = env.submit("bobs", token=bob)
    env.wait_done(mine)
    get = lambda q, t=None: _ids_on(env.client.get("/?" + q, headers=env.bearer(t)).text)  # noqa: E731
    assert get("label=team%3Da") == [mine]
    assert get("user=bob") == [bobs]
    assert get("name=min") == [mine]
    assert mine in get("status=COMPLETED") and get("status=FAILED") == []
    assert get("pool=local") and get("pool=nowhere") == []
    assert get("", bob) == [bobs]  # a user sees only their own, whatever ?user says
    assert get("user=root", bob) == [bobs]


# ------------------------------------------------------------------ escaping


def test_spec_and_failure_reason_are_escaped_on_the_workflow_page(env: Env) -> None:
    wid = env.submit(arg="<b>bold</b>")
    env.wait_done(wid)
    run = env.engine.run_dir(wid, "hello", 0)
    run.mkdir(parents=True, exist_ok=True)
    (run / "events.jsonl").write_text(
        json.dumps({"kind": "EXITED", "time_s": time.time(), "exit_code": 1, "message": EVIL})
        + "\n"
    )
    html = env.client.get(f"/workflows/{wid}", headers=env.bearer()).text
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>bold" not in html
    assert "&lt;script&gt;alert(" in html


def test_log_lines_go_to_the_browser_as_json_never_as_html(env: Env) -> None:
    wid = env.submit()
    env.wait_done(wid)
    run = env.engine.run_dir(wid, "hello", 0)
    run.mkdir(parents=True, exist_ok=True)
    (run / "task.log").write_text(f"2026/01/01 00:00:00 [hello] {EVIL}\n")
    stream = env.client.get(f"/workflows/{wid}/logs/stream", headers=env.bearer()).text
    events = [json.loads(x[6:]) for x in stream.splitlines() if x.startswith("data: {\"")]
    assert events[0]["line"] == EVIL and stream.rstrip().endswith("event: end\ndata: {}")
    page = env.client.get(f"/workflows/{wid}/logs?task=hello", headers=env.bearer())
    assert EVIL not in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'self'
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_compare_page_embeds_metric_names_escaped(env: Env) -> None:
    wid = env.submit()
    env.wait_done(wid)
    out = env.engine.run_dir(wid, "hello", 0) / "output"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text(json.dumps({"epoch": 1, EVIL: 1.0}) + "\n")
    html = env.client.get(f"/compare?id={wid}", headers=env.bearer()).text
    assert "<script>alert" not in html and "<img" not in html


# ------------------------------------------------------------------ metrics, pages


def test_metrics_json_has_curves_usage_and_summary(env: Env) -> None:
    wid = env.submit()
    env.wait_done(wid)
    run = env.engine.run_dir(wid, "hello", 0)
    (run / "output" / "models").mkdir(parents=True)
    lines = [
        {"event": "start"},
        {
            "event": "epoch",
            "epoch": 1,
            "val_loss": 2.0,
            "val_accuracy": 0.5,
            "throughput_images_per_s": 900.0,
        },
        {
            "event": "epoch",
            "epoch": 2,
            "val_loss": 1.0,
            "val_accuracy": 0.8,
            "throughput_images_per_s": 1000.0,
        },
        {"event": "summary", "epoch": 2, "x": 1},
    ]
    (run / "output" / "models" / "metrics.jsonl").write_text(
        "\n".join(map(json.dumps, lines)) + "\n{torn"
    )
    (run / "usage.jsonl").write_text(
        json.dumps({"time_s": 1.0, "cpu_percent": 50.0, "rss_bytes": 100, "processes": 1})
        + "\n"
        + json.dumps({"time_s": 3.0, "cpu_percent": 150.0, "rss_bytes": 300, "processes": 2})
        + "\n"
    )
    data = env.client.get(f"/api/workflow/{wid}/metrics", headers=env.bearer()).json()
    [curve] = data["curves"]
    assert curve["run"] == "hello/0" and curve["file"] == "models/metrics.jsonl"
    assert curve["series"]["val_loss"] == [[1.0, 2.0], [2.0, 1.0]]
    assert set(curve["series"]) == {"val_loss", "val_accuracy", "throughput_images_per_s"}
    [summary] = data["summary"]
    assert summary["samples"] == 2 and summary["cpu_mean_percent"] == 100.0
    assert summary["rss_peak_bytes"] == 300 and summary["gpu_peak_percent"] is None
    html = env.client.get(f"/workflows/{wid}", headers=env.bearer()).text
    assert 'id="usage"' in html and "150.0%" in html


def test_workflow_page_shows_dag_timeline_spec_and_buttons(env: Env) -> None:
    wid = env.submit()
    env.wait_done(wid)
    html = env.client.get(f"/workflows/{wid}", headers=env.bearer()).text
    for part in (
        'class="dag"',
        'class="gantt"',
        'id="spec"',
        'id="cancel"',
        'id="restart"',
        "hello · COMPLETED",
        "ph QUEUED",
    ):
        assert part in html, part


def test_pools_and_datasets_pages(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINYARD_DATASET_URL", str(env.home / "datasets"))
    pools = env.client.get("/pools", headers=env.bearer()).text
    assert 'id="resources"' in pools and "local" in pools
    datasets = env.client.get("/datasets", headers=env.bearer())
    assert datasets.status_code == 200 and "No dataset yet" in datasets.text


def test_static_vendor_files_and_licences_are_served(env: Env) -> None:
    for path in (
        "/static/vendor/htmx-2.0.4/htmx.min.js",
        "/static/vendor/htmx-2.0.4/LICENSE",
        "/static/vendor/uplot-1.6.31/uPlot.iife.min.js",
        "/static/vendor/uplot-1.6.31/LICENSE",
        "/static/dashboard.js",
    ):
        assert env.client.get(path).status_code == 200, path


def test_an_unknown_workflow_is_an_html_page_for_browsers_and_json_for_scripts(env: Env) -> None:
    page = env.client.get("/workflows/nope-1", headers={**env.bearer(), "Accept": "text/html"})
    assert page.status_code == 404 and 'id="error"' in page.text
    api = env.client.get("/api/workflow/nope-1", headers={**env.bearer(), "Accept": "text/html"})
    assert api.status_code == 404 and api.json()["kind"] == "NotFoundError"
    script = env.client.get("/workflows/nope-1", headers=env.bearer())
    assert script.status_code == 404 and script.json()["kind"] == "NotFoundError"


def test_log_stream_of_another_users_workflow_is_refused_before_streaming(env: Env) -> None:
    wid = env.submit()
    bob = env.tokens.add("bob")
    answer = env.client.get(f"/workflows/{wid}/logs/stream", headers=env.bearer(bob))
    assert answer.status_code == 403


def test_sse_of_a_quiet_task_backs_off_and_a_closed_page_ends_it() -> None:
    import asyncio

    from trainyard.server.logs import LogLine
    from trainyard.server.streams import LogReaders
    from trainyard.server.web import _sse

    class Quiet:  # a LogCursor of a task that printed one line and went quiet
        ended = False
        reads = 0

        def read(self, _max_bytes: int) -> tuple[list[LogLine], bool]:
            Quiet.reads += 1
            return (
                [LogLine("t", 0, "2026/01/01 00:00:00 [t] one")] if Quiet.reads == 1 else []
            ), Quiet.reads > 1

    chunks: list[str] = []

    async def read() -> None:
        async for chunk in _sse(Quiet(), LogReaders()):  # type: ignore[arg-type]
            chunks.append(chunk)

    with pytest.raises(asyncio.TimeoutError):  # the page closed: the stream is cancelled
        asyncio.run(asyncio.wait_for(read(), timeout=3))
    assert chunks[0].startswith("retry:") and '"line": "one"' in chunks[1]
    assert not any("event: end" in c for c in chunks)  # closed, not ended
    assert Quiet.reads <= 10, Quiet.reads  # waits grow to 0.4 s: 0.2, 0.3, 0.4, 0.4, ...


def test_metrics_api_without_token_or_session_is_401(env: Env) -> None:
    answer = env.client.get("/api/workflow/x-1/metrics", follow_redirects=False)
    assert answer.status_code == 401 and answer.json()["kind"] == "AuthError"


def test_restart_from_the_page_runs_a_failed_workflow_again(tmp_path: Path) -> None:
    launches: list[object] = []

    def first_fails(launch: object) -> Outcome:
        launches.append(launch)
        return Outcome(1 if len(launches) == 1 else 0, polls=1)

    backend = FakeBackend(first_fails)
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: backend,
    )
    with TestClient(create_app(Service(engine), TokenRegistry(tmp_path))) as client:
        env = Env(client, TokenRegistry(tmp_path), tmp_path, engine)
        wid = env.submit()
        assert env.wait_done(wid).startswith("FAILED")
        env.login()
        html = client.get(f"/workflows/{wid}").text
        assert 'id="restart">' in html  # enabled for a failed workflow
        answer = client.post(f"/workflows/{wid}/restart", data={"csrf": _csrf(html)})
        assert "restarted" in answer.text
        assert env.wait_done(wid) == "COMPLETED"


def test_datasets_page_lists_versions_and_tags(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard.data.datasets import DatasetStore
    from trainyard.data.transfer import LocalFile

    monkeypatch.setenv("TRAINYARD_DATASET_URL", str(env.home / "datasets"))
    data = env.home / "weights.bin"
    data.write_bytes(b"x" * 2048)
    store = DatasetStore()
    store.upload("model", [LocalFile(data, "weights.bin", 2048)])
    store.upload("model", [LocalFile(data, "weights.bin", 2048)], tag="best")
    html = env.client.get("/datasets", headers=env.bearer()).text
    assert "<h2>model</h2>" in html and "best, latest" in html and "2.0 KiB" in html


def test_a_form_posted_from_another_site_is_refused(env: Env) -> None:
    answer = env.client.post(
        "/login",
        data={"token": env.admin},
        follow_redirects=False,
        headers={"Origin": "https://evil.example"},
    )
    assert answer.status_code == 403 and SESSION_COOKIE not in answer.cookies
    same = env.client.post(
        "/login",
        data={"token": env.admin},
        follow_redirects=False,
        headers={"Origin": "http://testserver"},
    )
    assert same.status_code == 303
