"""``trainyard dataset`` and ``trainyard data`` through ``cli.main.main`` (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from data_unit_support import read_tree, write_tree

from trainyard.cli.main import main


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_dataset_commands_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_tree(tmp_path / "src", {"a.txt": "a", "b.bin": "b"})
    assert _run(capsys, "dataset", "upload", "mnist:gold", f"{src}/", "-q")[0] == 0
    code, out, _ = _run(capsys, "dataset", "upload", "mnist", str(src), "--regex", r"\.txt$", "-q")
    assert code == 0 and "version 2: 1 file(s)" in out

    code, out, _ = _run(capsys, "dataset", "list", "--format", "json")
    assert code == 0
    assert [(d["name"], d["versions"], d["latest"]) for d in json.loads(out)] == [("mnist", 2, 2)]
    code, out, _ = _run(capsys, "dataset", "info", "mnist", "--format", "json")
    info = json.loads(out)
    assert info["tags"] == {"gold": 1, "latest": 2}
    assert [(v["version"], v["files"]) for v in info["versions"]] == [(1, 2), (2, 1)]
    assert "mnist" in _run(capsys, "dataset", "info", "mnist")[1]  # the table for people

    assert _run(capsys, "dataset", "download", "mnist:gold", str(tmp_path / "out"), "-q")[0] == 0
    assert read_tree(tmp_path / "out") == {"a.txt": "a", "b.bin": "b"}
    assert _run(capsys, "dataset", "tag", "mnist:2", "best")[0] == 0
    assert _run(capsys, "dataset", "delete", "mnist:gold", "--yes")[0] == 0
    code, out, _ = _run(capsys, "dataset", "info", "mnist", "-t", "json")
    assert json.loads(out)["tags"] == {"best": 2, "latest": 2}


def test_dataset_errors_print_once_with_their_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = _run(capsys, "dataset", "download", "nope:3", str(tmp_path / "o"), "-q")
    assert code == 3 and err.count("error:") == 1 and "nope" in err
    code, _out, err = _run(capsys, "dataset", "upload", "x", str(tmp_path / "absent"), "-q")
    assert code == 9 and "absent" in err


def test_data_upload_list_download(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write_tree(tmp_path / "src", {"a.txt": "a", "d/b.txt": "b", "c.bin": "c"})
    url = (tmp_path / "remote").as_uri()
    code, out, err = _run(capsys, "data", "upload", url, str(src), "--regex", r"\.txt$")
    assert code == 0 and "uploaded 2 file(s)" in out
    assert "uploaded 2 file(s)" in err  # the throughput line, on stderr with the progress bar
    code, out, _ = _run(capsys, "data", "list", url, "--format", "json")
    assert [f["path"] for f in json.loads(out)] == ["src/a.txt", "src/d/b.txt"]
    code, out, _ = _run(capsys, "data", "download", f"{url}/src", str(tmp_path / "back"), "-q")
    assert code == 0 and read_tree(tmp_path / "back") == {"a.txt": "a", "d/b.txt": "b"}


def test_help_says_no_server_is_needed(capsys: pytest.CaptureFixture[str]) -> None:
    for group in ("data", "dataset"):
        _code, out, _err = _run(capsys, group, "--help")
        assert "no server" in " ".join(out.split())
