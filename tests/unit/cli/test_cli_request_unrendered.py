"""``cli.request.spec_request`` renders a spec only when its text contains ``localpath``
(issue 15, fifth pass): otherwise there is no file to find, so neither the render nor
PyYAML runs in the CLI, and the server (which renders every spec) refuses what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.cli.request import may_name_localpath, spec_request
from trainyard.errors import SpecError

SPEC = (
    "workflow:\n  name: w\n  tasks:\n  - name: t\n    command: ['{{ cmd }}']\n"
    "    files:\n    - path: /tmp/a\n      KEY: a.txt\n"
)


def _write(tmp_path: Path, key: str, command: str = "{{ cmd }}") -> Path:
    (tmp_path / "a.txt").write_text("A")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("KEY", key).replace("{{ cmd }}", command))
    return spec


def test_the_word_decides() -> None:
    assert may_name_localpath("files:\n- localpath: a.txt\n")
    assert may_name_localpath("# localpath only in a comment\n")  # renders: harmless
    assert not may_name_localpath("files:\n- contents: a\n")
    assert not may_name_localpath("files:\n- {{ 'local' ~ 'path' }}: a.txt\n")


def test_a_spec_naming_localpath_is_rendered_and_its_file_sent(tmp_path: Path) -> None:
    body = spec_request(
        _write(tmp_path, "localpath"), set_values=["cmd=echo"], set_strings=[], set_env=[]
    )
    assert body.files == {"a.txt": "A"}


def test_a_spec_naming_localpath_with_a_template_error_is_refused_here(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no_such_filter"):
        spec_request(
            _write(tmp_path, "localpath", "{{ 1 | no_such_filter }}"),
            set_values=[],
            set_strings=[],
            set_env=[],
        )


def test_a_spec_without_the_word_is_sent_unrendered_with_no_files(tmp_path: Path) -> None:
    """The template error is not found here (nothing rendered): the server refuses it
    (``tests/integration/cli/test_localpath_unrendered_e2e.py``)."""
    spec = _write(tmp_path, "{{ 'local' ~ 'path' }}", "{{ 1 | no_such_filter }}")
    body = spec_request(spec, set_values=["cmd=echo"], set_strings=[], set_env=[])
    assert body.files == {} and body.spec_text == spec.read_text()


def test_a_spec_over_the_size_limit_is_still_refused_here(tmp_path: Path) -> None:
    spec = tmp_path / "big.yaml"
    spec.write_text("# " + "x" * (5 * 2**20) + "\n")
    with pytest.raises(SpecError, match="over the limit"):
        spec_request(spec, set_values=[], set_strings=[], set_env=[])


def test_building_the_request_of_a_spec_without_the_word_loads_no_yaml(tmp_path: Path) -> None:
    spec = _write(tmp_path, "contents")
    probe = (
        "import json, sys\nfrom pathlib import Path\n"
        "from trainyard.cli.request import spec_request\n"
        f"spec_request(Path({str(spec)!r}), set_values=['cmd=echo'], set_strings=[],"
        " set_env=[], labels={'a': 'b'})\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert not loaded & {"yaml", "trainyard.spec.template", "jinja2"}, sorted(
        loaded & {"yaml", "trainyard.spec.template", "jinja2"}
    )
