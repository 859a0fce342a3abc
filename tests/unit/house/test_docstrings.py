"""Public API docstrings: a Parameters (numpy) or Args (google) section, and an example.

Every object in :data:`PUBLIC` (and, for a class, every public method or property the class
itself defines) must have a docstring that

* has a ``Parameters`` (``----`` underlined) or ``Args:`` section naming each parameter, when it
  takes any besides ``self``/``cls`` (a class: its constructor's);
* shows an example: a ``>>>`` line, or an ``Example(s)`` section (a property: inline code will do).

Methods a class inherits are checked where they are defined: Spark ML's ``fit``/``transform``
in pyspark, the ``set<Param>``/``get<Param>`` methods of TFEstimator and TFModel in
:mod:`tfonspark.ml.params`.

The examples of :data:`PUBLIC`, which need no cluster, are run, too, so that they stay true;
those of :data:`NEEDS_A_CLUSTER` are only checked for.
"""

from __future__ import annotations

import doctest
import importlib.util
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tfonspark
import tfonspark.keras
from tfonspark.distribute import SparkClusterResolver
from tfonspark.driver.cluster import ClusterHandle
from tfonspark.driver.services.serving import ServingCluster
from tfonspark.ml import TFEstimator, TFModel

PUBLIC: list[Any] = [
    SparkClusterResolver,  # its examples import TensorFlow, which tfonspark.keras above has loaded
    tfonspark.DataFeed,
    tfonspark.feed_dataset,
    tfonspark.hdfs_path,
    tfonspark.request_stop,
    TFEstimator,
    TFModel,
]

#: Checked the same way; their examples need a Spark cluster or a TF node, so they are not run.
NEEDS_A_CLUSTER: list[Any] = [
    tfonspark.run,
    tfonspark.Cluster,
    tfonspark.NodeContext,
    tfonspark.keras.fit,
    tfonspark.ps_cluster,
    tfonspark.PSCluster,
    ClusterHandle,  # what Cluster, PSCluster and DataService inherit: checked where it is defined
    ServingCluster,
]

#: Classes users get from tfonspark and never construct: their constructor is not documented.
MADE_FOR_USERS = {tfonspark.Cluster, tfonspark.NodeContext, tfonspark.PSCluster, ClusterHandle, ServingCluster}

_PARAMETERS = re.compile(r"^[ \t]*(Parameters[ \t]*\n[ \t]*-{3,}|Args:|Arguments:)[ \t]*$", re.M)
_EXAMPLE = re.compile(r"^[ \t]*(>>>|Examples?[ \t]*\n[ \t]*-{3,}[ \t]*$|Examples?:[ \t]*$)", re.M)
_SECTION_END = re.compile(r"^[ \t]*(\w[\w ]*\n[ \t]*-{3,}|\w[\w ]*:)[ \t]*$", re.M)


def _name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _members(cls: type) -> Iterator[tuple[str, Any, Callable[..., Any] | None]]:
    """The public methods and properties ``cls`` itself defines: (name, docstring owner, callable)."""
    for name, attr in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(attr, property):
            yield f"{_name(cls)}.{name}", attr, None
        elif isinstance(attr, (staticmethod, classmethod)):
            yield f"{_name(cls)}.{name}", attr.__func__, attr.__func__
        elif inspect.isfunction(attr):
            yield f"{_name(cls)}.{name}", attr, attr


def _checked(objects: list[Any]) -> list[tuple[str, Any, Callable[..., Any] | None]]:
    """Each object, and each public member of each class, with what takes its parameters."""
    out: list[tuple[str, Any, Callable[..., Any] | None]] = []
    for obj in objects:
        if inspect.isclass(obj):
            takes = "__init__" in vars(obj) and obj not in MADE_FOR_USERS
            out.append((_name(obj), obj, obj.__init__ if takes else None))
            out.extend(_members(obj))
        else:
            out.append((_name(obj), obj, obj))
    return out


def _parameters(fn: Callable[..., Any] | None) -> list[str]:
    """The parameter names a caller passes (not ``self``/``cls``, not private ``_name`` ones)."""
    if fn is None:
        return []
    names = list(inspect.signature(fn).parameters)
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return [n for n in names if not n.startswith("_")]


def _cases() -> list[Any]:
    return [pytest.param(doc, fn, id=name) for name, doc, fn in _checked(PUBLIC + NEEDS_A_CLUSTER)]


def _section(doc: str, start: re.Match[str]) -> str:
    """The text of the section that ``start`` opens, up to the next section header."""
    rest = doc[start.end() :]
    end = _SECTION_END.search(rest)
    return rest[: end.start()] if end else rest


@pytest.mark.parametrize(("owner", "fn"), _cases())
def test_docstring_has_parameters_and_an_example(owner: Any, fn: Callable[..., Any] | None) -> None:
    doc = owner.__doc__  # not inspect.getdoc: an inherited docstring does not count
    assert doc and doc.strip(), "no docstring"
    doc = inspect.cleandoc(doc)
    names = _parameters(fn)
    if names:
        header = _PARAMETERS.search(doc)
        assert header, f"takes {names} but has no Parameters (numpy) or Args: (google) section"
        section = _section(doc, header)
        missing = [n for n in names if not re.search(rf"^[ \t]*(\**\w+, *)*\**{re.escape(n)}\b", section, re.M)]
        assert not missing, f"the Parameters section does not describe {missing}"
    if isinstance(owner, property) and "``" in doc:
        return  # a property's example may be inline: ``cluster.restart_log[0].cause``
    assert _EXAMPLE.search(doc), "no example (a >>> line, or an Examples section)"


def _doctests() -> list[Any]:
    finder = doctest.DocTestFinder(recurse=True, exclude_empty=True)
    has_tf = importlib.util.find_spec("tensorflow") is not None
    cases = []
    seen: set[str] = set()
    for obj in PUBLIC:
        for test in finder.find(obj, module=inspect.getmodule(obj)):
            if test.name in seen or not test.examples:
                continue
            seen.add(test.name)
            needs_tf = test.name.endswith("as_dataset")
            marks = [pytest.mark.skipif(needs_tf and not has_tf, reason="needs tensorflow")]
            cases.append(pytest.param(test, id=test.name, marks=marks))
    return cases


@pytest.mark.timeout(120)
@pytest.mark.parametrize("test", _doctests())
def test_public_examples_run(test: doctest.DocTest) -> None:
    """The examples run as written (lines marked ``+SKIP`` need a Spark cluster and are not run)."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out: list[str] = []
    result = runner.run(test, out=out.append, clear_globs=True)
    assert result.failed == 0, "".join(out)
