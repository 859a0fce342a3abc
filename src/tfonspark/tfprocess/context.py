"""The context object handed to ``map_fun(args, ctx)`` in every TF process (TFoS-compatible)."""

from __future__ import annotations

import getpass
import re
import socket
from typing import Any

__all__ = ["NodeContext", "hdfs_path"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def hdfs_path(ctx: Any, path: str) -> str:
    """Resolve ``path`` against the cluster's default filesystem, as TFoS does.

    A path with a scheme is kept; an absolute path gets ``defaultFS``; a relative path goes under
    the working directory for ``file://`` and under ``/user/<user>/`` for hdfs and viewfs.
    """
    if _SCHEME.match(path):
        return path
    default_fs = ctx.defaultFS
    while default_fs.endswith("/") and not default_fs.endswith("://"):
        default_fs = default_fs[:-1]  # "file:///" -> "file://", "hdfs://nn:8020/" -> "hdfs://nn:8020"
    if path.startswith("/"):
        return default_fs + path
    if default_fs.startswith(("hdfs://", "viewfs://")):
        return f"{default_fs}/user/{getpass.getuser()}/{path}"
    if default_fs.startswith("file://"):
        return f"{default_fs}/{ctx.working_dir.strip('/')}/{path}"
    return f"{default_fs}/{path}"


class NodeContext:
    """Who this node is in the cluster, where its data comes from, and TFoS helpers."""

    def __init__(
        self,
        *,
        executor_id: int,
        job_name: str,
        task_index: int,
        cluster_spec: dict[str, list[str]],
        default_fs: str,
        working_dir: str,
        mgr: Any = None,
        tmp_socket: socket.socket | None = None,
        tensorboard_url: str = "",
    ) -> None:
        self.executor_id = executor_id
        self.worker_num = executor_id
        self.job_name = job_name
        self.task_index = task_index
        self.cluster_spec = cluster_spec
        self.num_workers = sum(len(v) for k, v in cluster_spec.items() if k in ("chief", "master", "worker"))
        self.defaultFS = default_fs
        self.working_dir = working_dir
        self.mgr = mgr
        self.tmp_socket = tmp_socket
        self.tensorboard_url = tensorboard_url

    @property
    def is_chief(self) -> bool:
        """True on the chief/master, or on worker 0 when the cluster has no chief."""
        if self.job_name in ("chief", "master"):
            return True
        has_chief = any(k in self.cluster_spec for k in ("chief", "master"))
        return self.job_name == "worker" and self.task_index == 0 and not has_chief

    def absolute_path(self, path: str) -> str:
        return hdfs_path(self, path)

    def release_port(self) -> None:
        """Free the port reserved for this node's TF server (``release_port=False`` clusters)."""
        if self.tmp_socket is not None:
            self.tmp_socket.close()
            self.tmp_socket = None

    def get_data_feed(
        self, train_mode: bool = True, qname_in: str = "input", qname_out: str = "output", input_mapping: Any = None
    ) -> Any:
        """A :class:`~tfonspark.tfprocess.datafeed.DataFeed` on this node's fed data."""
        from .datafeed import DataFeed

        return DataFeed(self.mgr, train_mode, qname_in, qname_out, input_mapping)

    def start_cluster_server(self, num_gpus: int = 1, rdma: bool = False) -> Any:
        from ..TFNode import start_cluster_server

        return start_cluster_server(self, num_gpus, rdma)

    def export_saved_model(self, *args: Any, **kwargs: Any) -> Any:
        from ..TFNode import export_saved_model

        return export_saved_model(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"NodeContext(executor_id={self.executor_id}, job_name={self.job_name!r}, "
            f"task_index={self.task_index}, num_workers={self.num_workers})"
        )
