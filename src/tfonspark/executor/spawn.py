"""How a node's TF processes start: their environment, command line and bootstrap.

A TF process is spawned, never forked, in its own session (so that its whole group can be
stopped), with every temp file of it in one private scratch dir (``host.make_scratch``, its
``TMPDIR``), and reads its bootstrap from stdin: the node's header (the descriptors as numbered
in it: its reserved port, its status pipe) and the payload (``map_fun``, ``tf_args``). A cold
one runs ``python -m tfonspark.tfprocess.entry``; a warm one (:mod:`.warm`: a standby, a spare)
was started ahead with TensorFlow imported and gets the same bootstrap when it is woken.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Mapping

from ..config import NodeConfig
from ..distribute.tf_config import TF_CONFIG_ENV, build_tf_config
from ..host import make_scratch, remove_scratch
from ..settings import BYTES_PER_PACK_ENV, COLLECTIVE_ENV, COLLECTIVE_TIMEOUT_ENV
from ..wire import messages as m
from ..wire.bootstrap import write_bootstrap
from . import tfos_env
from .gpus import assign as assign_gpus
from .gpus import cuda_env
from .warm import WarmProcess

__all__ = ["ATTEMPT_ENV", "Spawner", "without_wheel_zips"]

ATTEMPT_ENV = "TFONSPARK_ATTEMPT"  # the TF process's ctx.attempt (0 = first start of the cluster)


class Spawner:
    """What a node's TF processes are started with: its config, GPUs, Keras variables and payload."""

    def __init__(self, config: NodeConfig, executor_id: int, gpus: list[str], payload: bytes) -> None:
        self.config = config
        self.executor_id = executor_id
        self.gpus = gpus
        self.keras_env: dict[str, str] = {}  # executor/tfos_env.py's variables for the TF process
        self.payload = payload

    def settle(self, ready: m.ClusterReady) -> None:
        """The node's GPUs (:mod:`.gpus`) and Keras (:mod:`.tfos_env`), now that its task is known.

        ConfigError where it cannot have them (the node then fails, saying why): GPUs that stay
        busy, ``legacy_keras="on"`` without tf_keras.
        """
        self.gpus = assign_gpus(
            self.gpus, self.config.num_gpus, ready.cluster_spec, ready.job_name, ready.task_index, os.environ
        )
        self.keras_env = tfos_env.env_changes(self.config, os.environ)

    def label(self, ready: m.ClusterReady) -> list[str]:
        """The arguments that label a TF process of this node for ``ps`` (and for tests)."""
        return ["--cluster", self.config.cluster_id[:12], "--node", f"{ready.job_name}:{ready.task_index}"]

    def env(self, ready: m.ClusterReady, scratch: str) -> dict[str, str]:
        """The TF process's environment: its ``TF_CONFIG``, temp dir, GPUs, Keras."""
        env = dict(os.environ)
        if "PYTHONPATH" in env:
            env["PYTHONPATH"] = without_wheel_zips(env["PYTHONPATH"], sys.path)
        env["TMPDIR"] = env["TMP"] = env["TEMP"] = scratch
        env[TF_CONFIG_ENV] = build_tf_config(ready.cluster_spec, ready.job_name, ready.task_index)
        env[COLLECTIVE_ENV] = self.config.collective  # read by tfonspark.distribute.strategy()
        if self.config.collective_timeout:  # 0: TF's default, no timeout
            env[COLLECTIVE_TIMEOUT_ENV] = f"{self.config.collective_timeout:g}"
        if self.config.collective_bytes_per_pack:
            env[BYTES_PER_PACK_ENV] = str(self.config.collective_bytes_per_pack)
        env["PYTHONUNBUFFERED"] = "1"
        env[ATTEMPT_ENV] = str(self.config.attempt)  # ctx.attempt, for code that has no ctx
        env.update(self.keras_env)  # Keras 2 / TFoS import shims, where asked for
        env.update(cuda_env(self.gpus, env))  # CUDA_VISIBLE_DEVICES="" on the CPU: TF must not take every GPU
        return env

    def attempt_env(self, ready: m.ClusterReady) -> dict[str, str]:
        """What a spare started for the previous attempt must be told of this one (the rest matches)."""
        tf_config = build_tf_config(ready.cluster_spec, ready.job_name, ready.task_index)
        return {TF_CONFIG_ENV: tf_config, ATTEMPT_ENV: str(self.config.attempt)}

    def cold(
        self, ready: m.ClusterReady, host: str, port_sock: socket.socket, status_w: int
    ) -> tuple[subprocess.Popen[bytes], str]:
        """A new TF process (``-m tfonspark.tfprocess.entry``) holding ``port_sock``, bootstrapped;
        and its scratch dir. However it fails, no scratch dir is left behind."""
        scratch = make_scratch(self.config.cluster_id)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tfonspark.tfprocess.entry", *self.label(ready)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=self.env(ready, scratch),
                pass_fds=(port_sock.fileno(), status_w),
                start_new_session=True,
            )
            self.bootstrap(proc, ready, host, port_sock.fileno(), status_w)
        except BaseException:  # no TF process: nobody else would remove the directory
            remove_scratch(scratch)
            raise
        return proc, scratch

    def warm(self, ready: m.ClusterReady) -> WarmProcess:
        """A warm TF process for this node (:mod:`.warm`), in a scratch dir of its own."""
        scratch = make_scratch(self.config.cluster_id)
        try:
            return WarmProcess.start(self.env(ready, scratch), self.label(ready), scratch)
        except BaseException:
            remove_scratch(scratch)
            raise

    def wake(self, warm: WarmProcess, ready: m.ClusterReady, host: str, env: Mapping[str, str]) -> None:
        """Make ``warm`` (holding the node's port already) this node's TF process: ``env``, then its bootstrap."""
        warm.set_env(env)
        self.bootstrap(warm, ready, host, warm.port_fd, warm.status_fd)

    def bootstrap(
        self,
        proc: subprocess.Popen[bytes] | WarmProcess,
        ready: m.ClusterReady,
        host: str,
        port_fd: int,
        status_fd: int,
    ) -> None:
        """Send the TF process its bootstrap: the node's header (descriptors as numbered in it) and payload."""
        header = {
            "config": self.config.to_json(),
            "executor_id": self.executor_id,
            "job_name": ready.job_name,
            "task_index": ready.task_index,
            "cluster_spec": ready.cluster_spec,
            "host": host,
            "port_fd": port_fd,
            "status_fd": status_fd,
            "working_dir": os.getcwd(),
        }
        assert proc.stdin is not None
        with contextlib.suppress(OSError):  # if it died at once, its exit is reported as usual
            write_bootstrap(proc.stdin, header, self.payload)  # stdin stays open: EOF = we died


def without_wheel_zips(pythonpath: str, search: list[str]) -> str:
    """``pythonpath`` without the pyspark.zip and py4j zip that Spark puts first where the pyspark
    wheel holding them is installed on ``search`` (the TF process's own path): the same files.

    Python compiles a zip's modules on every import (the zips hold no bytecode), which made
    ``from pyspark import cloudpickle`` cost each TF process 1-2 s of its start-up; the installed
    copies load from their cached bytecode.
    """
    kept = []
    for entry in pythonpath.split(os.pathsep):
        lib = os.path.dirname(entry)  # .../site-packages/pyspark/python/lib
        installed = os.path.dirname(os.path.dirname(os.path.dirname(lib)))  # .../site-packages
        name = os.path.basename(entry)
        if lib.endswith(os.path.join("pyspark", "python", "lib")) and installed in search:
            if name == "pyspark.zip" and os.path.isfile(os.path.join(installed, "pyspark", "__init__.py")):
                continue
            version = name[len("py4j-") : -len("-src.zip")]
            if name.startswith("py4j-") and os.path.isdir(os.path.join(installed, f"py4j-{version}.dist-info")):
                continue
        kept.append(entry)
    return os.pathsep.join(kept)
