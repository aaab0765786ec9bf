"""Issue 24's low findings, each as the attack against a real server: the API's docs answered
without a token; the login form accepted ``Origin: null`` (a sandboxed frame or a data: page
logging a visitor into the attacker's account); ``/workflows/ID?msg=ANY TEXT`` showed any
text as the server's message; app names with NUL, newline or U+202E were stored and printed
raw (a forged row in ``app list``), and ``app create $'a\\x01b'`` crashed the CLI."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from conftest import QUIET, Live

SPEC = """
workflow:
  name: app-spec
  tasks:
  - name: t
    command: ["true"]
"""


def test_the_api_docs_need_a_token(live: Live) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        answer = httpx.get(live.url + path, timeout=30)
        assert answer.status_code in (401, 404), (path, answer.status_code)
        assert "openapi" not in answer.text.lower() or answer.status_code == 401
    assert httpx.get(live.url + "/api/openapi.json", timeout=30).status_code == 401
    schema = live.api("GET", "/api/openapi.json")
    assert schema.status_code == 200 and "/api/workflow" in schema.json()["paths"]


def test_login_from_an_opaque_origin_is_refused(live: Live) -> None:
    answer = httpx.post(
        live.url + "/login",
        data={"token": live.token, "next": "/"},
        headers={"Origin": "null"},
        timeout=30,
        follow_redirects=False,
    )
    assert answer.status_code == 403 and "trainyard_session" not in answer.headers.get(
        "set-cookie", ""
    )
    same = httpx.post(
        live.url + "/login",
        data={"token": live.token, "next": "/"},
        headers={"Origin": live.url},
        timeout=30,
        follow_redirects=False,
    )
    assert same.status_code == 303 and "trainyard_session" in same.headers["set-cookie"]


def test_the_workflow_page_shows_only_messages_the_server_made(live: Live) -> None:
    wid = live.submit(QUIET)
    forged = "Your token expired: log in again at https://evil.example"
    page = live.api("GET", f"/workflows/{wid}?msg={quote(forged)}", headers={"Accept": "text/html"})
    assert page.status_code == 200 and "evil.example" not in page.text
    with httpx.Client(base_url=live.url, timeout=30, follow_redirects=True) as browser:
        login = browser.post(
            "/login",
            data={"token": live.token, "next": f"/workflows/{wid}"},
            headers={"Origin": live.url},
        )
        csrf = login.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        done = browser.post(
            f"/workflows/{wid}/cancel", data={"csrf": csrf}, headers={"Origin": live.url}
        )
    assert done.status_code == 200 and "cancel requested" in done.text


@pytest.mark.parametrize(
    "name", ["a\x00b", "evil\nrow  99  root", "ok\u202eevil", "a\x01b", "a/b", "x" * 129]
)
def test_app_names_with_control_or_bidi_characters_are_refused(live: Live, name: str) -> None:
    answer = live.api("POST", f"/api/app/{quote(name, safe='')}", json={"spec_text": SPEC})
    if "/" in name:  # no such route: refused by the router
        assert answer.status_code in (404, 405), (name, answer.text)
    else:
        assert answer.status_code == 422 and answer.json()["kind"] == "SpecError", answer.text
    listed = live.api("GET", "/api/app").json()
    assert all(row["name"] != name for row in listed)


def test_the_cli_refuses_a_control_character_app_name_in_one_line(
    live: Live, tmp_path: Path
) -> None:
    spec = tmp_path / "app.yaml"
    spec.write_text(SPEC)
    done = live.cli("app", "create", "a\x01b", str(spec))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "'a\\x01b' is no valid app name" in done.stderr, done.stderr
    good = live.cli("app", "create", "fine-app", str(spec))
    assert good.returncode == 0, good.stderr
    assert "fine-app" in live.cli("app", "list").stdout
