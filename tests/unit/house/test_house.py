"""The layout's two rules, checked on the source: no import circles, and the TFoS faces stay faces.

Every ``import`` statement counts (``_graph.py``), including those inside functions (a lazy
import is still an arrow) and ``if TYPE_CHECKING:`` ones (a type-only back-reference is still a
circle for the reader). A submodule importing its own package (``from tfonspark import run``
inside a module the package imports) is a circle too. The direction between layers is
``test_layers.py``'s.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tfonspark
from tests.unit._graph import cycles, graph

FACES = {
    "tfonspark.compat",
    "tfonspark.TFCluster",
    "tfonspark.TFNode",
    "tfonspark.TFParallel",
    "tfonspark.pipeline",
    "tfonspark.dfutil",
}


def test_there_is_no_import_circle():
    assert cycles(graph()) == []


def test_the_core_never_imports_a_tfos_face():
    arrows = graph()
    offenders = {
        m: sorted(arrows[m] & FACES) for m in arrows if m not in FACES and m != "tfonspark" and arrows[m] & FACES
    }
    assert offenders == {}


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_never_imports_the_tfos_face():
    """tfprocess/ and distribute/ implement; TFNode.py only re-exports them (no import circle)."""
    package = Path(tfonspark.__file__).parent
    offenders = []
    for path in [*package.glob("tfprocess/*.py"), *package.glob("distribute/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n.split(".")[-1] == "TFNode" or n.endswith(".TFNode") for n in names):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
