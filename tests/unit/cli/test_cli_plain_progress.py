"""Issue 15, fifth pass: ``submit --wait`` prints its progress into a pipe without importing
rich (13-18 ms of CPU that competed with the gang's start on a 2-core machine): a line rich
would write unstyled is written directly, byte for byte what rich writes (checked against
rich here); anything else, and a terminal, still goes through rich."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from trainyard.cli.output import _styled, plain_line

_text = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=60),
    st.text(alphabet="ab :[]\\/dim\t-x.()`'", max_size=30),
)  # markup's own


def _rich(text: str, markup: bool) -> str:
    out = io.StringIO()
    Console(file=out, highlight=False, soft_wrap=True, force_terminal=False).print(
        text, markup=markup
    )
    return out.getvalue()


@settings(deadline=None, max_examples=400)
@given(text=_text, dim=st.booleans(), markup=st.booleans())
def test_a_plain_line_is_what_rich_writes_unstyled(text: str, dim: bool, markup: bool) -> None:
    line = f"[dim]{text[:5]}[/dim] {text}" if dim and markup else text
    plain = plain_line(line, markup=markup)
    if plain is not None:
        assert plain + "\n" == _rich(line, markup)


def test_progress_lines_of_wait_are_plain() -> None:
    assert (
        plain_line("[dim]    0.5s[/dim] training/master RUNNING on local-0")
        == "    0.5s training/master RUNNING on local-0"
    )
    assert (
        plain_line("Output of master: /tmp/x y/output", markup=False)
        == "Output of master: /tmp/x y/output"
    )
    for other in (
        "[bold]x[/bold]",
        "a :smile: b",
        "tab\there",
        "two\nlines",
        3,
        "[dim]\\[/dim] x",
        "[/dim] x",
        "[dim]a[/dim] [dim]b[/dim]",
    ):
        assert plain_line(other) is None


def test_wait_prints_its_progress_into_a_pipe_without_rich() -> None:
    probe = (
        "import json, sys\n"
        "from trainyard.cli import output\n"
        "output.err_console.print('[dim]    0.5s[/dim] training/master RUNNING on local-0')\n"
        "output.console.print('Output of master: /tmp/o', markup=False)\n"
        "print(json.dumps('rich' in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "Output of master: /tmp/o" and json.loads(lines[-1]) is False
    assert done.stderr == "    0.5s training/master RUNNING on local-0\n"


def test_styled_or_other_lines_still_go_through_rich() -> None:
    probe = (
        "import json, sys\n"
        "from trainyard.cli import output\n"
        "output.console.print('[bold]x[/bold]')\n"
        "print(json.dumps('rich' in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)},
    )
    assert done.stdout.splitlines() == ["x", "true"]
    done = subprocess.run(
        [sys.executable, "-c", probe.replace("[bold]x[/bold]", "plain")],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), "FORCE_COLOR": "1"},
    )
    assert done.stdout.splitlines()[-1] == "true"  # rich decides where it may style


@pytest.mark.parametrize("compatible", [None, "0", "1", "x"])
@pytest.mark.parametrize("force", [None, "", "1"])
def test_a_terminal_is_what_rich_calls_one(
    compatible: str | None, force: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (("TTY_COMPATIBLE", compatible), ("FORCE_COLOR", force)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    stream = io.StringIO()
    assert _styled(stream) == Console(file=stream).is_terminal
