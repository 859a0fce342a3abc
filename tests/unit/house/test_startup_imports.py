"""The supervisor and the TF process start fast: they import only what they need.

Every node pays for what these modules import on each start (and again at each restart), so
``import tfonspark`` is lazy (PEP 562) and neither loads the driver, numpy, TensorFlow or
pyspark.sql before ``map_fun`` asks for them.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tfonspark.executor.spawn import without_wheel_zips

_HEAVY = ("numpy", "tensorflow", "pyspark", "pyspark.sql", "tfonspark.driver", "pyarrow", "pandas")


def _loaded_after(module: str) -> list[str]:
    code = f"import sys, {module}; print(' '.join(m for m in {_HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.split()


def test_the_tf_process_entry_imports_nothing_heavy():
    assert _loaded_after("tfonspark.tfprocess.entry") == []


def test_the_supervisor_imports_nothing_heavy():
    assert _loaded_after("tfonspark.executor.supervisor") == []


def test_import_tfonspark_alone_loads_no_driver():
    assert _loaded_after("tfonspark") == []


def test_the_public_names_still_load_on_use():
    code = "import tfonspark; print(tfonspark.run.__name__, tfonspark.Cluster.__name__, 'run' in dir(tfonspark))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["run", "Cluster", "True"]


def test_the_wheels_own_zips_leave_the_tf_process_path(tmp_path):
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (site / "py4j-0.10.9.9.dist-info").mkdir()
    zips = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    path = os.pathsep.join([*zips, "/app/src"])
    assert without_wheel_zips(path, [str(site)]) == "/app/src"
    assert without_wheel_zips(path, []) == path  # the wheel is not on the TF process's path


def test_other_zips_stay(tmp_path):
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    other_py4j = str(lib / "py4j-0.10.9.8-src.zip")  # not the installed py4j's version
    distribution = "/opt/spark/python/lib/pyspark.zip"  # a Spark distribution: no installed wheel
    path = os.pathsep.join([distribution, other_py4j])
    assert without_wheel_zips(path, [str(site), "/opt"]) == path
