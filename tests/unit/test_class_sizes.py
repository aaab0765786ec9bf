"""No class does everything, anywhere in the package: at most ``MAX_METHODS`` methods in
one class, in the engine its inherited ones included (``INHERITED``: bases found in the
package, followed through ``from trainyard.X import Y``), so a chain of mixins sharing one
object counts as the one class it is; and at most ``MAX_LINES`` lines in one module, but for
the ones named in ``KNOWN_*`` (not split yet), which may not grow. An ast walk;
``scripts/house_numbers.py`` prints the numbers of the whole package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trainyard

MAX_METHODS = 25
"""Methods one class may have (in ``INHERITED`` folders, its bases' included)."""

MAX_LINES = 800
"""Lines one module may have."""

# No exception is left: Service (41 methods), Engine (61 with its bases), LocalBackend (50),
# KubernetesBackend (32), SlurmBackend (30) and the launcher (29) were split by subject.
KNOWN_CLASSES: dict[str, int] = {}
"""Classes over ``MAX_METHODS`` not split yet, with the most methods each may have."""

KNOWN_MODULES: dict[str, int] = {}
"""Modules over ``MAX_LINES`` not split yet, with the most lines each may have."""

_Classes = dict[str, dict[str, ast.ClassDef]]
"""Class definitions by module path (relative to the root, ``a/b.py``), then by name."""


def _module_path(root: Path, dotted: str) -> str:
    """``trainyard.a.b`` (or ``a.b`` under a root that is not the package) as ``a/b.py``."""
    parts = dotted.split(".")
    if parts[0] == "trainyard":
        parts = parts[1:]
    return "/".join(parts) + ".py"


def _imported_names(root: Path, tree: ast.Module) -> dict[str, tuple[str, str]]:
    """``{local name: (module path, name there)}`` of the module's ``from X import Y``."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = (_module_path(root, node.module), alias.name)
    return names


def _method_names(
    classes: _Classes,
    imports: dict[str, dict[str, tuple[str, str]]],
    module: str,
    node: ast.ClassDef,
) -> set[str]:
    """Names of the methods ``node`` defines or inherits from bases found under the root
    (an override counts once)."""
    names = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for base in node.bases:
        if not isinstance(base, ast.Name):
            continue  # Generic[...], module.Class: not followed
        where = (module, base.id) if base.id in classes[module] else imports[module].get(base.id)
        if where is not None and where[1] in classes.get(where[0], {}):
            names |= _method_names(classes, imports, where[0], classes[where[0]][where[1]])
    return names


def too_many_methods(root: Path, inherited: tuple[str, ...] = ("",)) -> list[str]:
    """Each class under ``root`` over its bound, as ``"path:Class: N methods (at most M)"``;
    one in a module whose path starts with one of ``inherited`` (default: every module)
    counts the methods it inherits from classes under ``root`` too."""
    classes: _Classes = {}
    imports: dict[str, dict[str, tuple[str, str]]] = {}
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes[module] = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        imports[module] = _imported_names(root, tree)
    found = []
    for module, defined in classes.items():
        for class_name, node in defined.items():
            if module.startswith(inherited):
                count = len(_method_names(classes, imports, module, node))
            else:
                count = sum(
                    isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body
                )
            name = f"{module}:{class_name}"
            bound = KNOWN_CLASSES.get(name, MAX_METHODS)
            if count > bound:
                found.append(f"{name}: {count} methods (at most {bound})")
    return found


def too_long(root: Path) -> list[str]:
    """Each module under ``root`` over its bound, as ``"path: N lines (at most M)"``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        bound = KNOWN_MODULES.get(name, MAX_LINES)
        if lines > bound:
            found.append(f"{name}: {lines} lines (at most {bound})")
    return found


PACKAGE = Path(trainyard.__file__).parent
INHERITED = ("engine/",)
"""Folders whose classes count their inherited methods too (the local backend's classes
inherit ``backends.base.Backend``'s documented hooks, not counted yet)."""


def test_no_class_has_more_methods_than_its_bound() -> None:
    assert too_many_methods(PACKAGE, INHERITED) == []


def test_no_module_is_longer_than_its_bound() -> None:
    assert too_long(PACKAGE) == []


def test_a_class_over_the_bound_is_named(tmp_path: Path) -> None:
    body = "".join(f"    def m{i}(self) -> None: ...\n" for i in range(MAX_METHODS + 1))
    (tmp_path / "big.py").write_text(f"class Big:\n{body}")
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert too_many_methods(tmp_path) == [f"big.py:Big: {MAX_METHODS + 1} methods (at most 25)"]
    assert too_long(tmp_path) == [f"long.py: {MAX_LINES + 1} lines (at most 800)"]


def test_a_chain_of_base_classes_counts_as_one_class(tmp_path: Path) -> None:
    """Five bases of 6 methods each, each under the bound alone, in a chain across modules
    (as the engine's phases once were): the last class has 30, and is named."""
    (tmp_path / "phases").mkdir()
    (tmp_path / "phases" / "p0.py").write_text(
        "class P0:\n" + "".join(f"    def a{i}(self) -> None: ...\n" for i in range(6))
    )
    for n in range(1, 5):
        methods = "".join(f"    def m{n}_{i}(self) -> None: ...\n" for i in range(6))
        (tmp_path / "phases" / f"p{n}.py").write_text(
            f"from trainyard.phases.p{n - 1} import P{n - 1}\n\n\nclass P{n}(P{n - 1}):\n{methods}"
        )
    (tmp_path / "phases" / "p5.py").write_text(
        "from phases.p4 import P4\n\n\nclass Facade(P4):\n    def a0(self) -> None: ...\n"
    )
    assert too_many_methods(tmp_path, INHERITED) == []  # not under engine/: bodies only
    assert too_many_methods(tmp_path, ("phases/",)) == [
        "phases/p4.py:P4: 30 methods (at most 25)",
        "phases/p5.py:Facade: 30 methods (at most 25)",
    ]
