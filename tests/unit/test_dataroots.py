"""The default data roots of a pool (``trainyard.dataroots``): the home's storage folder only,
never the host's temp folder (issue 11: a ``file://`` output could write anywhere in /tmp)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from trainyard import dataroots


def test_the_default_roots_are_the_home_storage_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert dataroots.data_roots({}, home) == [str(home / "storage")]


def test_each_user_has_a_folder_of_their_own_below_the_default_root(tmp_path: Path) -> None:
    """Bob's task read and overwrote ``storage/rootdata`` that the home's owner wrote."""
    home = tmp_path / "home"
    home.mkdir()
    owner = dataroots.home_owner(home)
    assert owner is not None
    assert dataroots.data_roots({}, home, owner) == [str(home / "storage")]
    bobs = dataroots.data_roots({}, home, "bob")
    assert bobs == [str(home / "storage" / "bob")]
    assert dataroots.url_problem(f"file://{home}/storage/rootdata/x", bobs, home) is not None
    assert dataroots.url_problem(f"file://{home}/storage/bob/x", bobs, home) is None
    assert dataroots.url_problem(f"file://{home}/storage/bob/../alice/x", bobs, home)
    for odd in ("..", "a/b", ""):
        assert dataroots.data_roots({}, home, odd) == []
    listed = {dataroots.OPTION: [str(tmp_path / "shared")]}  # a listed root is shared
    assert dataroots.data_roots(listed, home, "bob") == [str(tmp_path / "shared")]


def test_the_temp_folder_is_refused_unless_the_pool_lists_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    url = f"file://{tempfile.gettempdir()}/x"
    problem = dataroots.url_problem(url, dataroots.data_roots({}, home), home)
    assert problem is not None and "options.allowed_data_roots" in problem, problem
    listed = dataroots.data_roots({dataroots.OPTION: [tempfile.gettempdir()]}, home)
    assert dataroots.url_problem(url, listed, home) is None


def test_a_root_named_as_one_path_and_an_empty_list(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert dataroots.data_roots({dataroots.OPTION: str(tmp_path)}, home) == [str(tmp_path)]
    assert dataroots.data_roots({dataroots.OPTION: []}, home) == []
    problem = dataroots.url_problem(f"file://{home}/storage/x", [], home)
    assert problem is not None and "none: file:// is off" in problem
    assert dataroots.url_problem("s3://bucket/x", [], home) is None


def test_a_slurm_pool_may_list_data_roots() -> None:
    """The option belongs to every pool (the engine reads it); the Slurm backend's strict
    option check refused it, and an engine with such a pool never started its tasks."""
    from trainyard.backends.slurm.options import parse_options

    assert (
        parse_options("p", {"allowed_data_roots": ["/srv/data"], "partition": "x"}).partition == "x"
    )


def test_the_submit_check_uses_the_submitters_roots(tmp_path: Path, monkeypatch) -> None:
    """Issue 24: ``check_data_urls`` used the home owner's roots whoever submitted."""
    from trainyard.pools import default_local_pool
    from trainyard.spec import load

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TRAINYARD_HOME", str(home))
    spec = (
        "workflow:\n  name: w\n  tasks:\n  - name: t\n    command: [\"true\"]\n"
        f"    inputs:\n    - url: file://{home}/storage/alice/x\n"
    )
    load(spec, pool=default_local_pool(), user="alice")
    import pytest

    from trainyard.errors import SpecError

    with pytest.raises(SpecError) as caught:
        load(spec, pool=default_local_pool(), user="bob")
    text = str(caught.value)
    assert "task 't' input 0:" in text and "for user 'bob'" in text, text
    assert f"({home}/storage/bob)" in text, text
