"""TFoS-compatible face: ``TFCluster.run(...)`` and ``TFCluster.InputMode``.

Programs written for TensorFlowOnSpark run after changing only their import line::

    from tfonspark import TFCluster
    cluster = TFCluster.run(sc, main_fun, args, num_executors, num_ps, tensorboard,
                            TFCluster.InputMode.SPARK)

``TFCluster.run`` is :func:`tfonspark.run` for TFoS programs: their nodes run Keras 2
(``tf_keras`` with ``TF_USE_LEGACY_KERAS=1``) where ``tf_keras`` is installed (``pip install
'tfonspark[tfos]'``), as TFoS Keras code expects, and the one ``tensorflow_estimator`` helper
TFoS examples import (``export_lib.get_timestamped_export_dir``) is provided where
``tensorflow_estimator`` (gone since TF 2.16) is not installed. ``legacy_keras=False`` (or
``spark.tfonspark.legacyKeras=off``) keeps Keras 3.

The driver takes the same Keras 2 when this module is imported before TensorFlow, and
``Adam(lr=0.2)`` gets that learning rate in tf_keras as it did in Keras 2 (:mod:`tfonspark._tfos_keras`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import _tfos_keras
from .config import InputMode
from .driver.cluster import Cluster
from .driver.options import ClusterOptions, SettingKeywords
from .driver.plan import prepare
from .settings import Settings

if TYPE_CHECKING:
    from typing import Unpack

    from pyspark import SparkContext

    from .driver.nodes.launcher import Launcher
    from .driver.nodes.reports import Report

TFCluster = Cluster  # TFoS name of the class returned by run()

__all__ = ["Cluster", "InputMode", "TFCluster", "run"]

#: TFoS's default ``queues``: the manager queues of its nodes, which tfonspark does not have
_TFOS_QUEUES = ["input", "output", "error"]


def run(
    sc: SparkContext,
    map_fun: Callable[[Any, Any], Any],
    tf_args: Any,
    num_executors: int,
    num_ps: int,
    tensorboard: bool = False,
    input_mode: InputMode | int = InputMode.TENSORFLOW,
    log_dir: str | None = None,
    driver_ps_nodes: bool = False,
    master_node: str | None = None,
    reservation_timeout: float = 600,
    queues: Sequence[str] | None = _TFOS_QUEUES,  # noqa: B006  # TFoS's default, never mutated
    eval_node: bool = False,
    release_port: bool = True,
    *,
    settings: Settings | None = None,
    on_report: Callable[[Report], Any] | None = None,
    launcher: Launcher | None = None,
    max_restarts: int = 0,
    **by_name: Unpack[SettingKeywords],
) -> Cluster:
    """TFoS ``TFCluster.run``: :func:`tfonspark.run` with TFoS's positional arguments, and the TFoS
    face's Keras 2 for the nodes (and the driver).

    Parameters
    ----------
    sc, map_fun, tf_args, num_executors, num_ps, tensorboard, input_mode, log_dir, driver_ps_nodes, \
master_node, reservation_timeout, eval_node, release_port : as in TFoS
        As in TFoS 2.2.5, in its order (see :func:`tfonspark.run`).
    queues : list of str
        TFoS's manager queues; tfonspark has none (``cluster.train(..., qname=...)`` names any
        queue), so a value other than TFoS's default is ignored with a warning.
    settings, on_report, launcher, max_restarts, **by_name : keyword-only
        tfonspark's extras, as in :func:`tfonspark.run` (``by_name``: the settings by name).

    Examples
    --------
    >>> cluster = TFCluster.run(sc, main_fun, args, 2, 0, False, TFCluster.InputMode.SPARK)  # doctest: +SKIP
    """
    if queues is not None and list(queues) != _TFOS_QUEUES:
        warnings.warn(
            f"TFCluster.run: queues={queues!r} is ignored: tfonspark nodes have no manager queues "
            "(train(..., qname=...) feeds any queue name)",
            stacklevel=2,
        )
    options = ClusterOptions(
        num_ps, tensorboard, input_mode, log_dir, driver_ps_nodes, master_node, reservation_timeout, eval_node,
        release_port, max_restarts,
    )  # fmt: skip
    chosen = (settings or Settings()).merged(by_name)
    _tfos_keras.face_used(sc, chosen.legacy_keras)
    if callable(map_fun):  # else run() says what is wrong with it
        map_fun = _tfos_keras.FaceMapFun(map_fun)
    plan = prepare(
        sc, map_fun, tf_args, num_executors, options, chosen, on_report=on_report, launcher=launcher, tfos_face=True
    )
    return plan.start(Cluster)


_tfos_keras.face_imported()
