"""No module of tfonspark reaches into another object's private (``_name``) attributes.

An access ``x._name`` is allowed where ``x`` is ``self``, ``cls``, ``super()`` or a name the
module itself defines at its top level (its own classes, functions and constants); dunders are
always allowed. Anything else calls another module's or object's privates: give it a public
seam instead, or list it in ``ALLOWED`` below with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "tfonspark"

#: "receiver._name" -> why it is allowed (third-party and stdlib privates with no public form,
#: and the few of tfonspark's own that cannot have a public name yet)
ALLOWED = {
    "os._exit": "stdlib: exit at once (signal handler; skip teardown that TF's threads can hang)",
    "sys._getframe": "stdlib: the caller's module, for the Keras 2 import shim",
    "zlib._Decompress": "stdlib: the type of zlib.decompressobj(), for annotations",
    "sc._jsc": "pyspark: the JVM SparkContext (executor count, Hadoop conf) has no Python API",
    "rdd._jrdd": "pyspark: forces the pipelined RDD as PySpark's own barrier code does",
    "rdd._is_pipelinable": "pyspark: see rdd._jrdd",
    "Params._dummy": "pyspark ML: the documented way to declare a Param on a class",
    "instance._resetUid": "pyspark ML: DefaultParamsReader's own way to restore a saved uid",
    "_estimator.TFEstimator._fit": "pyspark ML: _fit is Estimator's override point; the TFoS face wraps it",
    "self.instance._extra_metadata": "the persistence hook TFEstimator/TFModel implement; private so it is not a user method of the stage",
    "self.cls._from_metadata": "the persistence hook TFEstimator/TFModel implement; private so it is not a user method of the stage",
    "base._process_kwargs": "Keras 2 optimizer internals that the lr= shim patches",
    "base._build_learning_rate": "Keras 2 optimizer internals that the lr= shim patches",
    "base._tfonspark_patched": "a marker this module sets on the Keras class it patches",
    "optimizer._trainable_variables": "Keras 3: the optimizer's variables before build(), no public form",
    "handover._lock": "this module's own _Handover objects, given a new lock after fork",
    "replacement._tfos_handover": "a marker this module sets on the functions it patches in",
}


def _own_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (not the ones it imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _receiver(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
        return "super()"
    return ast.unparse(node)


def violations(source: str, rel: str) -> list[str]:
    """``"rel:line: receiver._name"`` for every access to another object's private name in ``source``."""
    tree = ast.parse(source, rel)
    own = _own_names(tree) | {"self", "cls", "super()"}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__"):
            continue
        receiver = _receiver(node.value)
        if receiver in own or f"{receiver}.{node.attr}" in ALLOWED:
            continue
        found.append(f"{rel}:{node.lineno}: {receiver}.{node.attr}")
    return sorted(found, key=lambda v: int(v.split(":")[1]))


def test_no_module_reaches_into_private_names():
    paths = sorted(SRC.rglob("*.py"))
    found = [v for path in paths for v in violations(path.read_text(), path.relative_to(SRC).as_posix())]
    assert found == [], "private names used from outside their module or object:\n" + "\n".join(found)


def test_the_rule_sees_what_it_must():
    source = (
        "import os\n"
        "class A:\n    def f(self, other):\n        return self._x, other._y, A._z, super()._w, os.__file__\n"
        "def g(cluster):\n    cluster._begin()\n"
    )
    assert violations(source, "probe.py") == ["probe.py:4: other._y", "probe.py:6: cluster._begin"]
