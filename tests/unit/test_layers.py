"""Imports point one way, down docs/architecture.md's order, and no modules import each other.

An ast walk over every module of the package (imports inside functions and under
``TYPE_CHECKING`` count too): an edge from a lower layer to a higher one, an edge between two
layers of the same rank (store and backends), any import of the rest by ``training/`` and any
circle between modules fail, each named with its file and line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import trainyard

ORDER: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("server",),
    ("engine",),
    ("store", "backends"),
    ("runner",),
    ("data",),
    ("spec",),
)
"""Layers from the top down; a layer imports only those below it. Every module of the package
outside these folders (and outside ``training/``) is the bottom: the shared vocabulary
(``status``, ``errors``, ``home``, ``runfile``, ``pools``, ...) and ``linux/``."""

APART = "training"
"""Runs inside tasks: imports nothing of the rest of the package."""


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``path``:``line``."""

    source: str
    target: str
    path: Path
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} -> {self.target}"


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module under ``root`` (the folder of ``package``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _known(name: str, names: dict[str, Path]) -> str | None:
    """The longest module of ``names`` that ``name`` lies in (a name imported from a package
    may be a module or an attribute)."""
    while name and name not in names:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names ``node`` imports, relative imports resolved against ``module``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [f"{base}.{alias.name}" for alias in node.names]


def edges(root: Path, package: str) -> list[Edge]:
    """Every import between two modules of ``package``, wherever in the file it is made."""
    names = modules(root, package)
    found = []
    for module, path in names.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(node, module, path.name == "__init__.py"):
                target = _known(name, names) if name.split(".")[0] == package else None
                if target is not None and target != module:
                    found.append(Edge(module, target, path, node.lineno))
    return found


def layer_of(module: str) -> str:
    """The layer folder of ``module`` (``"bottom"`` for the vocabulary and ``linux/``)."""
    parts = module.split(".")
    known = {name for rank in ORDER for name in rank} | {APART}
    return parts[1] if len(parts) > 1 and parts[1] in known else "bottom"


def rank_of(layer: str) -> int:
    """0 for the top layer; the bottom is below every layer of ``ORDER``."""
    return next((i for i, rank in enumerate(ORDER) if layer in rank), len(ORDER))


def against_the_order(found: list[Edge]) -> list[Edge]:
    """The edges that go up, sideways between layers of one rank, or into or out of
    ``training/``."""
    bad = []
    for edge in found:
        source, target = layer_of(edge.source), layer_of(edge.target)
        if source == target:
            continue
        if APART in (source, target) or rank_of(source) >= rank_of(target):
            bad.append(edge)
    return bad


def circles(found: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        result.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return result


PACKAGE_ROOT = Path(trainyard.__file__).parent


def test_no_import_goes_against_the_layers() -> None:
    bad = against_the_order(edges(PACKAGE_ROOT, "trainyard"))
    assert not bad, "imports against the layers:\n" + "\n".join(map(str, bad))


def test_no_modules_import_each_other() -> None:
    found = circles(edges(PACKAGE_ROOT, "trainyard"))
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_checker_finds_a_planted_upward_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "engine/__init__.py": "",
            "engine/loop.py": "from pkg.runner import main\n",
            "runner/__init__.py": "",
            "runner/main.py": "def f():\n    from pkg.engine import loop  # lazy, still an edge\n",
            "status.py": "",
        },
    )
    found = edges(root, "pkg")
    assert [str(e).rsplit(": ", 1)[1] for e in against_the_order(found)] == [
        "pkg.runner.main -> pkg.engine.loop"
    ]
    assert circles(found) == [["pkg.engine.loop", "pkg.runner.main"]]


def test_the_checker_finds_sideways_and_training_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "store/db.py": "import pkg.backends.local\n",
            "backends/local.py": "from ..status import X\n",
            "training/train.py": "from pkg import status\n",
            "status.py": "",
        },
    )
    bad = {(e.source, e.target) for e in against_the_order(edges(root, "pkg"))}
    assert bad == {("pkg.store.db", "pkg.backends.local"), ("pkg.training.train", "pkg.status")}
