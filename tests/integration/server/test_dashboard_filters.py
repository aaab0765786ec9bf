"""Issue 24, "the dashboard's /datasets lists other users' unshared datasets": against a real
server, bob uploads a dataset he shares with nobody; carol's dashboard does not list it (as
`dataset list` does not), until bob shares it with her; an admin sees it."""

from __future__ import annotations

from pathlib import Path

import httpx
from conftest import Live


def datasets_page(live: Live, token: str) -> str:
    page = httpx.get(
        live.url + "/datasets",
        timeout=60,
        headers={"Authorization": f"Bearer {token}", "Accept": "text/html"},
    )
    assert page.status_code == 200, page.text
    return page.text


def test_the_datasets_page_lists_only_what_dataset_list_shows(live: Live, tmp_path: Path) -> None:
    bob, carol = live.add_user("ds-bob"), live.add_user("ds-carol")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("secret\n")
    done = live.cli(
        "dataset", "upload", "bobs-unshared", f"{tmp_path / 'src'}/", "--quiet", token=bob
    )
    assert done.returncode == 0, done.stderr
    listed = live.cli("dataset", "list", token=carol)
    assert listed.returncode == 0 and "bobs-unshared" not in listed.stdout
    assert "bobs-unshared" not in datasets_page(live, carol)
    assert "bobs-unshared" in datasets_page(live, bob)
    assert "bobs-unshared" in datasets_page(live, live.token)  # the admin
    shared = live.cli("dataset", "share", "bobs-unshared", "--user", "ds-carol", token=bob)
    assert shared.returncode == 0, shared.stderr
    assert "bobs-unshared" in datasets_page(live, carol)
