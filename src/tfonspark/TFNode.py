"""TFoS-compatible helpers for code running inside a TF node (``map_fun(args, ctx)``).

A face only: each name is the core's (``tfprocess/``, ``distribute/``) or a one-line adapter to
TFoS's signature. Nothing in the core imports this module.
"""

from __future__ import annotations

import os
from typing import Any

from . import _tfos_keras
from .tfprocess.context import NodeContext, hdfs_path
from .tfprocess.datafeed import DataFeed
from .tfprocess.server import start_cluster_server

__all__ = [
    "DataFeed",
    "batch_results",
    "export_saved_model",
    "hdfs_path",
    "next_batch",
    "release_port",
    "start_cluster_server",
    "terminate",
]


def release_port(ctx: NodeContext) -> None:
    """Give the port reserved for this node to the TF server you start next (``release_port=False``).

    As in TFoS, call it before starting the server; the port stays held until that server binds
    it (:meth:`~tfonspark.tfprocess.context.NodeContext.release_port`).
    """
    ctx.release_port()


def next_batch(mgr: Any, batch_size: int, qname: str = "input") -> Any:
    """TFoS ``TFNode.next_batch``: up to ``batch_size`` rows from the feed."""
    return DataFeed(mgr, True, qname).next_batch(batch_size)


def batch_results(mgr: Any, results: Any, qname: str = "output") -> None:
    """TFoS ``TFNode.batch_results``: return inference results for the last batch."""
    DataFeed(mgr, False, qname_out=qname).batch_results(results)


def terminate(mgr: Any, qname: str = "input") -> None:
    """TFoS ``TFNode.terminate``: stop the feed early."""
    DataFeed(mgr, True, qname).terminate()


def export_saved_model(
    model: Any, export_dir: str | os.PathLike[str], signatures: Any = None, is_chief: bool = True
) -> str | None:
    """Export a Keras 3 model or ``tf.Module`` as a SavedModel (TF 2 meaning of the TFoS helper).

    A Keras model built under a distribution strategy, without ``signatures``, is exported by
    every worker (the save runs collective ops) and kept by the chief only, whatever
    ``is_chief`` says. Anything else is written only where ``is_chief`` is true: with
    ``signatures`` through ``tf.saved_model.save``, else through ``model.export`` when the model
    has one. Returns the directory where this node wrote, or None. The implementation is
    :func:`tfonspark.distribute.checkpoint.export_saved_model`.
    """
    from .distribute.checkpoint import export_saved_model as export

    return export(model, export_dir, signatures=signatures, is_chief=is_chief)


_tfos_keras.face_imported()  # a TFoS program: the driver takes the nodes' Keras 2
