"""``TFEstimator``: a Spark ML Estimator that trains on a tfonspark cluster and returns a TFModel.

``fit(df)`` does what TFoS's ``pipeline.TFEstimator`` did, on tfonspark's cluster:

1. merges ``tf_args`` with every Param into ``args`` (:meth:`TFParams.merge_args_params`);
2. starts ``cluster_size`` TensorFlow nodes running ``train_fn(args, ctx)`` (``tfonspark.run``
   with ``num_ps``, ``master_node`` (default ``'chief'``), ``driver_ps_nodes``, ``tensorboard``);
3. feeds the data, by ``input_mode``:

   * ``InputMode.SPARK`` (default): ``df.select(sorted(input_mapping))`` is fed ``epochs``
     times (``Cluster.train``). In ``train_fn``, ``ctx.get_data_feed(input_mapping=args.input_mapping)``
     gives batches as ``{tensor_name: numpy array}`` (or use ``.as_dataset(batch_size)``), exactly
     as TFoS's ``TFNode.DataFeed(ctx.mgr, input_mapping=args.input_mapping)`` did;
   * ``InputMode.TENSORFLOW``: nothing is fed. The DataFrame (its ``input_mapping`` columns, if
     any) is written as TFRecords to ``tfrecord_dir`` and ``args.tfrecord_dir`` tells ``train_fn``
     where; a DataFrame read by ``dfutil.loadTFRecords`` is not written again, ``args.tfrecord_dir``
     is the directory it came from;

4. shuts the cluster down (``grace_secs``), then runs ``export_fn(args)`` once on an executor
   if given (e.g. to build a serving model from the checkpoints in ``model_dir``);
5. returns a :class:`~tfonspark.ml.TFModel` with ``tf_args`` and every Param the two share
   (``export_dir``, ``input_mapping``, ``output_mapping``, ``signature_def_key``, ``tag_set``,
   ``batch_size``, ``model_dir``).

``train_fn`` should export a SavedModel to ``args.export_dir`` for the model to serve, e.g.
``tfonspark.keras.export_saved_model(model, args.export_dir)`` on every node (the chief
keeps it). Any node failure raises :class:`~tfonspark.errors.NodeFailed` with the node's
traceback; the cluster is stopped either way. With ``maxRestarts`` > 0 a failed cluster is
started again instead (``args.max_restarts``; ``train_fn`` resumes from ``model_dir``, and the
epochs not yet read through are fed again), up to that many times.

``output_mapping``, ``signature_def_key`` and ``tag_set`` are TFModel Params that the estimator
carries too, so a fitted model in a ``Pipeline`` is ready to serve without setting them after
``fit``. When the training ``input_mapping`` also names tensors the signature does not take (the
label), TFModel ignores those entries.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from pyspark.ml import Estimator

from ..config import InputMode
from ..driver.cluster import Cluster
from ..driver.options import ClusterOptions
from ..driver.plan import prepare
from ..errors import ClusterError, ConfigError, InputError
from ..settings import Settings
from ..wire.errors import captured, raise_or
from .model import TFModel
from .params import (
    HasBatchSize,
    HasClusterSize,
    HasEpochs,
    HasExportDir,
    HasFeedTimeout,
    HasGraceSecs,
    HasInputMapping,
    HasInputMode,
    HasMasterNode,
    HasMaxRestarts,
    HasModelDir,
    HasNumPS,
    HasOutputMapping,
    HasProtocol,
    HasReaders,
    HasSignatureDefKey,
    HasSteps,
    HasTagSet,
    HasTensorboard,
    HasTFRecordDir,
    Namespace,
    TFParams,
)
from .persistence import TFPersistence, decode_args, decode_function, encode_args, encode_function

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = ["TFEstimator"]

log = logging.getLogger(__name__)

#: TFoS 2.x defaults, plus tfonspark's ``feed_timeout`` and the TFModel Params it hands on.
ESTIMATOR_DEFAULTS: dict[str, Any] = {
    "input_mapping": {},
    "cluster_size": 1,
    "num_ps": 0,
    "driver_ps_nodes": False,
    "input_mode": int(InputMode.SPARK),
    "master_node": "chief",
    "protocol": "grpc",
    "tensorboard": False,
    "model_dir": None,
    "export_dir": None,
    "tfrecord_dir": None,
    "batch_size": 100,
    "epochs": 1,
    "readers": 1,
    "steps": 1000,
    "grace_secs": 30,
    "max_restarts": 0,
    "feed_timeout": 600,
    "output_mapping": {},
    "signature_def_key": "serving_default",
    "tag_set": None,
}


class TFEstimator(
    Estimator[TFModel],
    TFParams,
    HasInputMapping,
    HasClusterSize,
    HasNumPS,
    HasInputMode,
    HasMasterNode,
    HasProtocol,
    HasGraceSecs,
    HasMaxRestarts,
    HasTensorboard,
    HasModelDir,
    HasExportDir,
    HasTFRecordDir,
    HasBatchSize,
    HasEpochs,
    HasReaders,
    HasSteps,
    HasFeedTimeout,
    HasOutputMapping,
    HasSignatureDefKey,
    HasTagSet,
    TFPersistence,
):
    """Trains ``train_fn(args, ctx)`` on a tfonspark cluster (TFoS ``pipeline.TFEstimator``).

    ``fit(df)`` (Spark ML's) starts the cluster, feeds ``df``, shuts the cluster down and returns
    a :class:`~tfonspark.ml.TFModel`: the steps are in :mod:`tfonspark.ml.estimator`. The
    ``set<Param>``/``get<Param>`` methods (TFoS names, e.g. ``setInputMapping``) set and read
    the Params of :mod:`tfonspark.ml.params`; each setter returns the estimator, for chaining.

    ``save``/``load`` store the functions by reference (``module:qualname``) and ``tf_args`` as
    JSON; functions from ``__main__``/notebooks, lambdas, or ``tf_args`` JSON cannot hold need
    ``allow_pickle=True`` on both sides (:mod:`tfonspark.ml.persistence`).

    Parameters
    ----------
    train_fn : callable
        ``train_fn(args, ctx)``, run on every node: ``args`` is ``tf_args`` with every Param
        set as an attribute (:meth:`merge_args_params`), ``ctx`` the node's
        :class:`~tfonspark.NodeContext`. It should export a SavedModel to ``args.export_dir``.
    tf_args : dict, argparse.Namespace, Namespace or list of str, optional
        The user's arguments; an argv list is handed to ``train_fn`` as is, as in TFoS.
    export_fn : callable, optional
        ``export_fn(args)``, run once on an executor after training (e.g. to build a serving
        model from the checkpoints in ``model_dir``).

    Examples
    --------
    >>> from tfonspark.ml import TFEstimator
    >>> def train_fn(args, ctx):
    ...     from tfonspark.distribute import export_saved_model
    ...     feed = ctx.get_data_feed(input_mapping=args.input_mapping)
    ...     dataset = feed.as_dataset(args.batch_size)  # batches of {"x": ..., "y": ...}
    ...     model = build_model(args.lr)  # your Keras model
    ...     model.fit(dataset.map(lambda d: (d["x"], d["y"])))
    ...     export_saved_model(model, args.export_dir)
    >>> estimator = (TFEstimator(train_fn, {"lr": 0.1})
    ...              .setInputMapping({"features": "x", "label": "y"})  # column -> tensor
    ...              .setClusterSize(2).setEpochs(3).setExportDir("/models/m"))
    >>> estimator.merge_args_params().lr, estimator.getEpochs()
    (0.1, 3)
    >>> model = estimator.fit(train_df)  # doctest: +SKIP
    >>> model.setOutputMapping({"output_0": "prediction"}).transform(test_df)  # doctest: +SKIP
    """

    _tfos_face = False  # pipeline.TFEstimator: nodes run Keras 2 where tf_keras is installed

    def __init__(self, train_fn: Any, tf_args: Any = None, export_fn: Any = None) -> None:
        super().__init__()
        for name, fn in (("train_fn", train_fn), ("export_fn", export_fn)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{name} must be a function. Received: {name}={fn!r}")
        if train_fn is None:
            raise ConfigError("train_fn is required: a function train_fn(args, ctx) run on every node")
        self.train_fn = train_fn
        self.export_fn = export_fn
        self.args = Namespace(tf_args)
        self._setDefault(**ESTIMATOR_DEFAULTS)

    def _fit(self, dataset: Any) -> TFModel:
        """Train on ``dataset`` and return a TFModel sharing this estimator's Params."""
        args = self.merge_args_params()
        mode = InputMode(args.input_mode)
        if mode == InputMode.SPARK:
            feed = _feed_frame(dataset, self.getInputMapping())
        else:
            feed = None
            args.tfrecord_dir = _tfrecords_for(dataset, self.getInputMapping(), args.tfrecord_dir)
        tf_args = args.argv if args.argv else args
        options = ClusterOptions(
            num_ps=args.num_ps,
            tensorboard=args.tensorboard,
            input_mode=mode,
            master_node=args.master_node,
            driver_ps_nodes=args.driver_ps_nodes,
            max_restarts=args.max_restarts,
        )
        sc = dataset.sparkSession.sparkContext
        plan = prepare(sc, self.train_fn, tf_args, args.cluster_size, options, Settings(), tfos_face=self._tfos_face)
        cluster = plan.start(Cluster)
        _train_and_shutdown(cluster, feed, args)
        if self.export_fn is not None:
            _run_export_fn(dataset.sparkSession.sparkContext, self.export_fn, tf_args)
        _warn_if_no_saved_model(args.export_dir)
        return self._copyValues(TFModel(self.args))

    # ---- persistence ---------------------------------------------------------------------------
    # ``train_fn``/``export_fn`` are saved by reference (module:qualname) and ``tf_args`` as
    # JSON; anything else needs allow_pickle (see tfonspark.ml.persistence).
    def _extra_metadata(self, allow_pickle: bool = False) -> dict[str, Any]:
        return {
            "tf_args": encode_args(self.args, allow_pickle),
            "train_fn": encode_function(self.train_fn, allow_pickle, "train_fn"),
            "export_fn": encode_function(self.export_fn, allow_pickle, "export_fn"),
        }

    @classmethod
    def _from_metadata(cls, metadata: dict[str, Any], allow_pickle: bool = False) -> TFEstimator:
        train_fn = decode_function(metadata.get("train_fn"), allow_pickle, "train_fn")
        export_fn = decode_function(metadata.get("export_fn"), allow_pickle, "export_fn")
        return cls(train_fn, decode_args(metadata.get("tf_args"), allow_pickle), export_fn=export_fn)


def _feed_frame(dataset: Any, mapping: dict[str, str]) -> Any:
    """The columns fed in InputMode.SPARK, in sorted order (TFoS), after checking they exist."""
    columns = list(dataset.columns)
    if not mapping:
        raise ConfigError(
            "TFEstimator feeds the DataFrame columns named in input_mapping "
            "(InputMode.SPARK); set input_mapping={column: tensor_name}. Received: "
            f"input_mapping={{}}; DataFrame columns: {columns}"
        )
    missing = [c for c in sorted(mapping) if c not in columns]
    if missing:
        raise InputError(
            f"input_mapping names column(s) {missing} that the DataFrame lacks; available columns: {columns}",
            column=missing[0],
        )
    for column in sorted(mapping):
        if type(dataset.schema[column].dataType).__name__ == "VectorUDT":
            raise InputError(
                "a Spark ML vector column cannot be fed; convert it with pyspark.ml.functions.vector_to_array",
                column=column,
            )
    return dataset.select(sorted(mapping))


def _tfrecords_for(dataset: Any, mapping: dict[str, str], tfrecord_dir: str | None) -> str:
    """Where train_fn reads the data in InputMode.TENSORFLOW (writing TFRecords if needed)."""
    from ..data.tfrecord import loaded_from, save_tfrecords

    source = loaded_from(dataset)
    if source is not None:
        return source
    if not tfrecord_dir:
        raise ConfigError(
            "InputMode.TENSORFLOW writes the DataFrame as TFRecords for train_fn to "
            "read; set tfrecord_dir (or fit a DataFrame read with "
            "tfonspark.dfutil.loadTFRecords). Received: tfrecord_dir=None"
        )
    frame = dataset.select(list(mapping)) if mapping else dataset
    try:
        files = save_tfrecords(frame, tfrecord_dir)
    except ConfigError as err:
        raise ConfigError(
            f"TFEstimator could not write the DataFrame as TFRecords to "
            f"tfrecord_dir={tfrecord_dir!r}; it must be missing or empty: {err}"
        ) from err
    log.info("wrote %d TFRecord file(s) to %s", len(files), tfrecord_dir)
    return files[0].rsplit("/", 1)[0] if files else tfrecord_dir


def _train_and_shutdown(cluster: Any, feed: Any, args: Namespace) -> None:
    """Feed (SPARK mode) and shut down; on any error stop the cluster, then re-raise."""
    try:
        if feed is not None:
            cluster.train(feed, args.epochs, args.feed_timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.shutdown(grace_secs=0, timeout=60)
        raise
    cluster.shutdown(grace_secs=args.grace_secs)


def _run_export_fn(sc: SparkContext, export_fn: Any, tf_args: Any) -> None:
    """Run ``export_fn(args)`` once, in a one-task Spark job (an executor's Python worker).

    A tfonspark error raised by ``export_fn`` is raised again here as itself (type and
    attributes); any other failure becomes a ClusterError quoting its last error line.
    """

    def call(_: Any) -> list[int]:
        export_fn(tf_args)
        return []

    try:
        sc.parallelize([0], 1).mapPartitions(captured(call)).collect()
    except Exception as exc:
        raise_or(exc, lambda line: ClusterError(f"export_fn failed on an executor: {line}"))


def _warn_if_no_saved_model(export_dir: str | None) -> None:
    """A hint in the log when training ended without the SavedModel the TFModel will need."""
    from .savedmodel import read_saved_model, resolve_export_dir

    if not export_dir:
        return
    try:
        read_saved_model(resolve_export_dir(export_dir))
    except Exception as err:  # only a hint: transform() raises the real error
        log.warning(
            "after training, export_dir=%r holds no readable SavedModel (%s); did train_fn export one?", export_dir, err
        )
