"""The GC pauses: around a feed chunk, and around TensorFlow's first import in a TF process.

The import hook runs in a fresh interpreter over a stand-in ``tensorflow`` package: it freezes
the interpreter's heap, which must not happen to the test process.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tfonspark.gcpause import paused

REPO = Path(__file__).resolve().parents[2]

PROBE = """\
import gc, json, sys
import tfonspark.gcpause
tfonspark.gcpause.freeze_tensorflow_on_import()
tfonspark.gcpause.freeze_tensorflow_on_import()
hooks = sum(type(f).__name__ == "AfterImport" for f in sys.meta_path)
try:
    import tensorflow
    seen, error = tensorflow.GC_ON, ""
except RuntimeError as exc:
    seen, error = None, str(exc)
print(json.dumps({"hooks": hooks, "during": seen, "after": gc.isenabled(), "frozen": gc.get_freeze_count(),
                  "error": error}))
"""


def _import_fake_tf(tmp_path: Path, body: str) -> dict:
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text(textwrap.dedent(body))
    env = {"PYTHONPATH": f"{tmp_path}:{REPO / 'src'}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_tensorflows_first_import_runs_without_the_gc_and_its_objects_are_frozen(tmp_path) -> None:
    found = _import_fake_tf(tmp_path, "import gc\nGC_ON = gc.isenabled()\nOBJECTS = [[i] for i in range(5000)]\n")
    assert found["hooks"] == 1, "installed once however often it is asked"
    assert found["during"] is False and found["after"] is True
    assert found["frozen"] > 5000, "the import's objects are out of the GC's sight"


def test_an_import_that_fails_leaves_the_gc_on_and_freezes_nothing(tmp_path) -> None:
    found = _import_fake_tf(tmp_path, "raise RuntimeError('no TF here')\n")
    assert found["error"] == "no TF here"
    assert found["after"] is True and found["frozen"] == 0


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_restores_the_state_it_found(enabled: bool) -> None:
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(ValueError), paused():
            assert not gc.isenabled()
            raise ValueError
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
