"""The default data roots of a pool (``trainyard.dataroots``): the home's storage folder only,
never the host's temp folder (issue 11: a ``file://`` output could write anywhere in /tmp)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from trainyard import dataroots


def test_the_default_roots_are_the_home_storage_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert dataroots.data_roots({}, home) == [str(home / "storage")]


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

    assert parse_options("p", {"allowed_data_roots": ["/srv/data"], "partition": "x"}).partition == "x"
