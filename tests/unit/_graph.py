"""The import graph of ``src/tfonspark``, read from the source (nothing is imported).

Every ``import`` statement counts, including those inside functions (a lazy import is still an
arrow) and ``if TYPE_CHECKING:`` ones (a type-only back-reference is still an arrow for the
reader). ``from pkg import mod`` counts as importing ``pkg.mod``. Used by ``test_house.py``
(no circles, faces stay faces) and ``test_layers.py`` (imports only go down the layers).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name), with its file."""
    out = {}
    for path in (SRC / "tfonspark").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in arrows[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in arrows:
        if v not in index:
            visit(v)
    return found
