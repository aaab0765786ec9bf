"""Module docstrings state contracts, not history (docs/architecture.md, "Docstrings").

Every module of ``src/trainyard`` keeps its docstring to at most ``MAX_LINES`` lines (design
prose belongs in docs/, linked by path), and no source file there names an "issue N": the
history of a change lives in git and docs/benchmarks-history.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import trainyard

PACKAGE = Path(trainyard.__file__).parent
MAX_LINES = 15
ISSUE_REF = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)

KNOWN_EXCEPTIONS: frozenset[str] = frozenset()
"""Files excused from the rule (none now: every module keeps it)."""


def _excepted(relative: str) -> bool:
    """True for a file in ``KNOWN_EXCEPTIONS``."""
    return relative in KNOWN_EXCEPTIONS


def _sources() -> list[tuple[str, Path]]:
    """Every Python and JavaScript file of the package, as (path relative to it, path)."""
    files = [*PACKAGE.rglob("*.py"), *PACKAGE.rglob("*.js")]
    return sorted((path.relative_to(PACKAGE).as_posix(), path) for path in files)


def docstring_lines(source: str) -> int:
    """Lines the module docstring of ``source`` spans, quotes included; 0 without one."""
    body = ast.parse(source).body
    if not body or ast.get_docstring(ast.Module(body=body[:1], type_ignores=[])) is None:
        return 0
    first = body[0]
    return (first.end_lineno or first.lineno) - first.lineno + 1


def issue_references(source: str) -> list[int]:
    """Line numbers (from 1) of ``source`` that name an "issue N"."""
    return [n for n, line in enumerate(source.splitlines(), 1) if ISSUE_REF.search(line)]


def test_module_docstrings_stay_short() -> None:
    long = [
        f"{relative}: {lines} lines"
        for relative, path in _sources()
        if path.suffix == ".py" and not _excepted(relative)
        if (lines := docstring_lines(path.read_text(encoding="utf-8"))) > MAX_LINES
    ]
    assert not long, f"module docstrings over {MAX_LINES} lines (move prose to docs/): {long}"


def test_no_issue_references_in_source() -> None:
    found = [
        f"{relative}:{line}"
        for relative, path in _sources()
        if not _excepted(relative)
        for line in issue_references(path.read_text(encoding="utf-8"))
    ]
    assert not found, f'"issue N" in source (history goes to git): {found}'


def test_the_checks_can_fail() -> None:
    long_doc = '"""' + "\n" * MAX_LINES + '"""\n'
    assert docstring_lines(long_doc) == MAX_LINES + 1
    assert docstring_lines('"""one line."""\nx = 1\n') == 1
    assert docstring_lines("x = 1\n") == 0
    assert issue_references("a\n# fixed in issue 15\n") == [2]
    assert issue_references("# the issues page\n") == []
