"""Print the house numbers of issue 27: largest classes by method count and files over 800 lines.

Usage: python scripts/house_numbers.py [ROOT] (ROOT defaults to src/trainyard).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def class_method_counts(root: Path) -> list[tuple[int, str]]:
    """Return (methods, "path:Class") for every class under `root`, most methods first."""
    rows: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = [
                    n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                ]
                rows.append((len(methods), f"{path.relative_to(root)}:{node.name}"))
    return sorted(rows, reverse=True)


def long_files(root: Path, limit_lines: int = 800) -> list[tuple[int, str]]:
    """Return (lines, path) for every module under `root` longer than `limit_lines`."""
    rows = [
        (len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(root)))
        for p in root.rglob("*.py")
    ]
    return sorted((r for r in rows if r[0] > limit_lines), reverse=True)


def main() -> None:
    """Print the ten largest classes and the long files."""
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src/trainyard")
    print("largest classes (methods):")
    for count, name in class_method_counts(root)[:10]:
        print(f"  {count:3d}  {name}")
    print("files > 800 lines:")
    for lines, name in long_files(root):
        print(f"  {lines:5d}  {name}")


if __name__ == "__main__":
    main()
