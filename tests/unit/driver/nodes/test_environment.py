"""The driver's error for node tasks whose executor Python cannot run a node."""

from __future__ import annotations

import pytest

from tfonspark.driver.nodes.environment import check, chosen_python
from tfonspark.errors import ConfigError, ExecutorEnvironmentError
from tfonspark.executor.preflight import REPORT
from tfonspark.wire import events as ev


class _Conf(dict):
    def get(self, key, default=None):
        return super().get(key, default)


class _Context:
    def __init__(self, python_exec: str, **conf: str) -> None:
        self.pythonExec = python_exec
        self._conf = _Conf(conf)

    def getConf(self):
        return self._conf


WHERE = {"python": "/usr/bin/python3.11", "prefix": "/usr", "python_version": "3.11.7", "host": "h1"}


def test_task_statuses_alone_pass():
    check([ev.TaskUp(tf_pid=12), {"a": "dict"}], _Context("python3"), "0.1.0")


def test_a_missing_tfonspark_names_the_python_how_spark_chose_it_and_the_fix(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    report = {REPORT: "missing", **WHERE, "error": "ModuleNotFoundError: No module named 'tfonspark'"}
    with pytest.raises(ExecutorEnvironmentError) as raised:
        check([report, dict(report, host="h2")], _Context("python3"), "0.1.0")
    err = raised.value
    assert isinstance(err, ConfigError)
    text = str(err)
    assert "ran '/usr/bin/python3.11' (Python 3.11.7, sys.prefix '/usr')" in text and "'h1'" in text
    assert "2 node tasks" in text and "No module named 'tfonspark'" in text
    assert "Spark started 'python3', from the default" in text
    assert "--archives env.tar.gz#env --conf spark.pyspark.python=./env/bin/python" in text
    assert "install tfonspark 0.1.0" in text
    assert (err.python, err.host, err.driver_version, err.executor_version) == (
        "/usr/bin/python3.11",
        "h1",
        "0.1.0",
        "",
    )


def test_another_version_names_both():
    report = {REPORT: "version", **WHERE, "executor_version": "0.0.9", "location": "/x/tfonspark"}
    sc = _Context("./env/bin/python", **{"spark.pyspark.python": "./env/bin/python"})
    with pytest.raises(ExecutorEnvironmentError, match=r"tfonspark is '0.0.9'.*the driver's is '0.1.0'") as raised:
        check([report], sc, "0.1.0")
    assert "from spark.pyspark.python='./env/bin/python'" in str(raised.value)
    assert raised.value.executor_version == "0.0.9"


def test_the_driver_s_pyspark_python_is_named(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/py/bin/python")
    sc = _Context("/opt/py/bin/python", **{"spark.executorEnv.PYSPARK_PYTHON": "/other"})
    assert chosen_python(sc) == (
        "Spark started '/opt/py/bin/python', from PYSPARK_PYTHON='/opt/py/bin/python' on the driver; "
        "spark.executorEnv.PYSPARK_PYTHON='/other'"
    )
