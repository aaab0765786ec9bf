"""The runner checks ``file://`` URLs against the pool's data roots again, just before it
moves data, with symlinks resolved then (a link made after submit cannot send a download
or an upload outside the roots)."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_support import execute, log_text, make_run, make_tree

pytestmark = pytest.mark.usefixtures("home")


def test_an_input_through_a_symlink_out_of_the_roots_fails_2010(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", make_tree(tmp_path / "secret", {"key": "s3cret\n"})
    root.mkdir()
    (root / "link").symlink_to(outside)
    run = make_run(
        tmp_path,
        "cat {{input:0}}/key\n",
        data_roots=[str(root)],
        data_home=str(tmp_path / "home"),
        inputs=[{"kind": "url", "name": "u", "source": f"file://{root}/link/"}],
    )
    assert execute(run) == 2010
    assert "outside the pool's data roots" in log_text(run)
    assert "s3cret" not in log_text(run)


def test_an_output_through_a_symlink_out_of_the_roots_fails_2012(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "host"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    run = make_run(
        tmp_path,
        "echo x > {{output}}/x\n",
        data_roots=[str(root)],
        data_home=str(tmp_path / "home"),
        outputs=[{"url": f"file://{root}/link/"}],
    )
    assert execute(run) == 2012
    assert not list(outside.iterdir())
    assert "refused" in log_text(run)


def test_inside_the_roots_it_works_and_no_roots_means_no_file_urls(tmp_path: Path) -> None:
    root = tmp_path / "root"
    src = make_tree(root / "src", {"a.txt": "a\n"})
    run = make_run(
        tmp_path,
        "cat {{input:0}}/a.txt\n",
        data_roots=[str(root)],
        data_home=str(tmp_path / "home"),
        inputs=[{"kind": "url", "name": "u", "source": f"file://{src}/"}],
    )
    assert execute(run) == 0
    off = make_run(
        tmp_path,
        "true\n",
        task="t2",
        data_roots=[],
        data_home=str(tmp_path / "home"),
        inputs=[{"kind": "url", "name": "u", "source": f"file://{src}/"}],
    )
    assert execute(off) == 2010
    assert "none: file:// is off" in log_text(off)
