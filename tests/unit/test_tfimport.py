"""TensorFlow's first import in a TF process: the GC paused then frozen, Keras's optional
integrations deferred; the GC pause around a feed chunk; deferred modules themselves.

The import hook runs in a fresh interpreter over stand-in ``tensorflow``, ``keras`` and
``matplotlib`` packages: it freezes the interpreter's heap, which must not happen to the test
process. Deferred modules are made in fresh interpreters too (``sys.modules`` stays clean here).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """\
import gc, json, sys
import tfonspark.tfimport
tfonspark.tfimport.prepare_tensorflow_import()
tfonspark.tfimport.prepare_tensorflow_import()
hooks = sum(type(f).__name__ == "AfterImport" for f in sys.meta_path)
try:
    import tensorflow
    seen, error = tensorflow.GC_ON, ""
except RuntimeError as exc:
    seen, error = None, str(exc)
ran = list(sys.modules["ran"].RAN) if "ran" in sys.modules else []
kinds = {name: type(sys.modules.get(name)).__name__ for name in ("keras.wrappers", "matplotlib.pyplot")}
finders = [type(f).__name__ for f in sys.meta_path]
import keras.wrappers
before_use = list(sys.modules["ran"].RAN) if "ran" in sys.modules else []
used = keras.wrappers.WRAPPER if error == "" else None
print(json.dumps({"hooks": hooks, "during": seen, "after": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "error": error, "ran": ran, "kinds": kinds, "finders": finders, "before_use": before_use,
                  "used": used, "ran_after_use": list(sys.modules["ran"].RAN)}))
"""

# a stand-in Keras: ``import tensorflow`` imports it, and it imports both optional integrations
FAKE_KERAS = {
    "ran.py": "RAN = []\n",
    "keras/__init__.py": "from keras import wrappers as wrappers\n",
    "keras/wrappers.py": "import ran\nran.RAN.append('wrappers')\nWRAPPER = 'sklearn-backed'\n",
    "matplotlib/__init__.py": "",
    "matplotlib/pyplot.py": "import ran\nran.RAN.append('pyplot')\n",
}


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _run(tmp_path: Path, code: str) -> dict:
    env = {"PYTHONPATH": f"{tmp_path}:{REPO / 'src'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _import_fake_tf(tmp_path: Path, body: str) -> dict:
    _tree(tmp_path, {**FAKE_KERAS, "tensorflow/__init__.py": body})
    return _run(tmp_path, PROBE)


TF_BODY = """\
import gc
GC_ON = gc.isenabled()
OBJECTS = [[i] for i in range(5000)]
import keras
import matplotlib.pyplot as plt
"""


def test_tensorflows_first_import_runs_without_the_gc_and_its_objects_are_frozen(tmp_path) -> None:
    found = _import_fake_tf(tmp_path, TF_BODY)
    assert found["hooks"] == 1, "installed once however often it is asked"
    assert found["during"] is False and found["after"] is True
    assert found["frozen"] > 5000, "the import's objects are out of the GC's sight"


def test_kerass_optional_integrations_run_at_their_first_use_not_at_the_import(tmp_path) -> None:
    found = _import_fake_tf(tmp_path, TF_BODY)
    assert found["ran"] == [], "neither integration ran inside import tensorflow"
    assert found["kinds"] == {"keras.wrappers": "_DeferredModule", "matplotlib.pyplot": "_DeferredModule"}
    assert "Deferred" not in found["finders"], "only the TF import defers; later imports are as usual"
    assert found["before_use"] == [], "a later import statement alone does not run it either"
    assert found["used"] == "sklearn-backed" and found["ran_after_use"] == ["wrappers"]


def test_an_import_that_fails_leaves_the_gc_on_and_freezes_nothing(tmp_path) -> None:
    found = _import_fake_tf(tmp_path, "raise RuntimeError('no TF here')\n")
    assert found["error"] == "no TF here"
    assert found["after"] is True and found["frozen"] == 0
    assert "Deferred" not in found["finders"]
