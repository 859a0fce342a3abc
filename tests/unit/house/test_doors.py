"""One door per API: every public name leaves by one module's ``__all__``; the rest are aliases.

The doors are the modules users import from (README, examples, docs). A TFoS face is the door
to TFoS's own names; where it hands out a door's object under a TFoS name, that is an alias,
listed in ``ALIASES`` and checked to be the very same object. A name that leaves by two doors,
or a face that re-exports a door's object without saying so here, fails.
"""

from __future__ import annotations

import importlib
import types

import pytest

pytest.importorskip("tensorflow")  # tfonspark.keras imports it

DOORS = [
    "tfonspark",
    "tfonspark.errors",
    "tfonspark.keras",
    "tfonspark.distribute",
    "tfonspark.data.tfrecord",
    "tfonspark.ml",
    "tfonspark.testing",
    "tfonspark.demo",
    "tfonspark.tensorfx",
]

FACES = [
    "tfonspark.TFCluster",
    "tfonspark.TFNode",
    "tfonspark.TFParallel",
    "tfonspark.TFManager",
    "tfonspark.compat",
    "tfonspark.pipeline",
    "tfonspark.dfutil",
]

#: face -> {its name: (door, the door's name)}: the same object under the face's (TFoS) name
ALIASES = {
    "tfonspark.dfutil": {
        "isLoadedDF": ("tfonspark.data.tfrecord", "is_loaded_df"),
        "loadTFRecords": ("tfonspark.data.tfrecord", "load_tfrecords"),
        "loadedDF": ("tfonspark.data.tfrecord", "loaded_dfs"),
        "saveAsTFRecords": ("tfonspark.data.tfrecord", "save_tfrecords"),
    },
    "tfonspark.TFCluster": {
        "Cluster": ("tfonspark", "Cluster"),
        "InputMode": ("tfonspark", "InputMode"),
        "TFCluster": ("tfonspark", "Cluster"),
    },
    "tfonspark.TFNode": {
        "DataFeed": ("tfonspark", "DataFeed"),
        "hdfs_path": ("tfonspark", "hdfs_path"),
    },
    "tfonspark.pipeline": {
        "Namespace": ("tfonspark.ml", "Namespace"),
        "TFModel": ("tfonspark.ml", "TFModel"),
        "TFParams": ("tfonspark.ml", "TFParams"),
    },
}

#: import paths that are no door (any more): they export nothing
NOT_DOORS = ["tfonspark.data"]


def _exported(name: str) -> dict[str, object]:
    module = importlib.import_module(name)
    return {n: getattr(module, n) for n in module.__all__}


def _shared(value: object) -> bool:
    """Whether ``value`` can name one API (modules and plain constants cannot: 100 is 100)."""
    return not isinstance(value, (types.ModuleType, int, float, str, bytes, bool, type(None)))


@pytest.mark.parametrize("name", DOORS + FACES)
def test_all_is_sorted_and_complete(name):
    module = importlib.import_module(name)
    assert list(module.__all__) == sorted(module.__all__)
    assert [n for n in module.__all__ if not hasattr(module, n)] == []


def test_no_name_leaves_by_two_doors():
    seen: dict[int, str] = {}
    twice = []
    for door in DOORS:
        for name, value in _exported(door).items():
            if _shared(value):
                where = f"{door}.{name}"
                if id(value) in seen:
                    twice.append((seen[id(value)], where))
                seen.setdefault(id(value), where)
    assert twice == []


def test_the_aliases_are_the_doors_own_objects():
    for face, names in ALIASES.items():
        exported = _exported(face)
        for name, (door, door_name) in names.items():
            assert door_name in importlib.import_module(door).__all__, f"{door}.{door_name} is no door"
            assert exported[name] is getattr(importlib.import_module(door), door_name), f"{face}.{name}"


def test_a_face_hands_out_a_doors_object_only_as_a_listed_alias():
    doors = {id(v): f"{d}.{n}" for d in DOORS for n, v in _exported(d).items() if _shared(v)}
    unlisted = [
        f"{face}.{name} is {doors[id(value)]}"
        for face in FACES
        for name, value in _exported(face).items()
        if id(value) in doors and name not in ALIASES.get(face, {})
    ]
    assert unlisted == []


def test_dfutil_is_only_aliases():
    assert sorted(_exported("tfonspark.dfutil")) == sorted(ALIASES["tfonspark.dfutil"])


@pytest.mark.parametrize("name", NOT_DOORS)
def test_a_former_door_exports_nothing(name):
    assert importlib.import_module(name).__all__ == []


def test_keras_and_distribute_split_the_training_api():
    keras_door, distribute = _exported("tfonspark.keras"), _exported("tfonspark.distribute")
    assert {"fit", "export_saved_model", "Progress"} <= set(keras_door) and "strategy" not in keras_door
    assert {"strategy", "task_info", "is_chief"} <= set(distribute) and "fit" not in distribute
