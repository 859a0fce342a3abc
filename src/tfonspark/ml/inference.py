"""TFModel inference on the executors: Arrow batches -> numpy -> the signature -> Arrow.

:func:`serve_arrays` is a scalar-iterator Arrow UDF (Spark >= 4.1): it receives only the mapped
columns as Arrow arrays, turns them into numpy arrays without per-row Python work, calls the
signature ``batch_size`` rows at a time, and returns only the outputs (a struct when there are
several); the other columns never leave the JVM. On older Spark, :func:`serve_batches` does the
same as a ``mapInArrow`` function that passes the whole batch through. The loaded signature is
kept per Python worker in :class:`~tfonspark.ml.model_cache.ModelCache`, under the key the
driver made from the model's location and content (``ServingPlan.model_key``). What is served
comes from the driver's :class:`~tfonspark.ml.binding.ServingPlan`; the binding rules (casts,
reshapes, output types) are in :mod:`tfonspark.ml.binding`.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np

from ..errors import ConfigError, InputError
from ..tfimport import importing_tensorflow
from ..wire.arrow import arrow_to_columns
from .binding import INPUT_NUMPY, OUTPUT_TYPES, InputBinding, OutputBinding, ServingPlan
from .model_cache import ModelCache

__all__ = [
    "LoadedSignature",
    "column_array",
    "load_signature",
    "output_array",
    "outputs_to_arrow",
    "predict",
    "serve_arrays",
    "serve_batches",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
#: an Arrow batch's inputs up to this size are served in one graph call (see :func:`predict`)
_LOOP_BYTES = 64 * 1024 * 1024


def _fit_shape(values: np.ndarray, b: InputBinding, partition: int) -> np.ndarray:
    """Values as the input's per-row shape: as they are, or reshaped when element counts agree."""
    if b.shape is None or b.dtype == "string":
        return values
    want, got = b.shape[1:], values.shape[1:]
    if len(want) == len(got) and all(w is None or w == g for w, g in zip(want, got)):
        return values
    known = [w for w in want if w is not None]
    if len(known) == len(want) and math.prod(got) == math.prod(known):
        return values.reshape((len(values), *known))
    raise InputError(
        f"column values of shape {list(got)} per row do not fit signature input "
        f"{b.tensor!r} of shape {[None if w is None else w for w in want]} per row",
        column=b.column,
        partition=partition,
    )


def _fit_dtype(values: Any, b: InputBinding, partition: int) -> np.ndarray:
    """Values cast to the input's dtype where numpy allows a same-kind cast."""
    if b.dtype == "string":
        if isinstance(values, np.ndarray) and values.dtype != object:
            raise InputError(
                f"column holds {values.dtype} values but signature input {b.tensor!r} takes strings",
                column=b.column,
                partition=partition,
            )
        return np.asarray(values, dtype=object)
    want = INPUT_NUMPY.get(b.dtype)
    if want is None:
        raise InputError(
            f"signature input {b.tensor!r} has dtype {b.dtype}, which no column can feed",
            column=b.column,
            partition=partition,
        )
    if not isinstance(values, np.ndarray) or values.dtype == object:
        raise InputError(
            f"column holds text or binary values but signature input {b.tensor!r} takes {b.dtype}",
            column=b.column,
            partition=partition,
        )
    if values.dtype == want:
        return values
    if not np.can_cast(values.dtype, want, casting="same_kind"):
        raise InputError(
            f"column holds {values.dtype} values but signature input {b.tensor!r} takes "
            f"{b.dtype}; cast the column first",
            column=b.column,
            partition=partition,
        )
    return values.astype(want)


def column_array(column: Any, b: InputBinding, partition: int, first_row: int) -> np.ndarray:
    """One Arrow column as the numpy array signature input ``b`` takes."""
    import pyarrow as pa

    single = pa.RecordBatch.from_arrays([column], names=[b.column])
    values = arrow_to_columns(single, partition, first_row).columns[0]
    return _fit_shape(_fit_dtype(values, b, partition), b, partition)


def predict(fn: Any, inputs: Mapping[str, np.ndarray], plan: ServingPlan, rows: int) -> dict[str, np.ndarray]:
    """Call the signature ``plan.batch_size`` rows at a time; the outputs as numpy, row-aligned.

    Several batches of a :class:`LoadedSignature` run in one call of a graph that loops over
    them (:meth:`LoadedSignature.batched`): the signature still sees ``batch_size`` rows at a
    time, but Python calls TensorFlow once per Arrow batch, not once per ``batch_size`` rows
    (~0.3 ms a call). Only for inputs up to 64 MiB, as the whole batch becomes one tensor (larger
    ones go slice by slice, one slice's tensors at a time). Where that graph fails or its
    outputs are not one row per input row, the batches are called one by one, which raises the
    error that names the output.
    """
    small = sum(v.nbytes for v in inputs.values() if isinstance(v, np.ndarray)) <= _LOOP_BYTES
    if rows > plan.batch_size and small and isinstance(fn, LoadedSignature):
        outputs = fn.batched(inputs, plan, rows)
        if outputs is not None:
            return outputs
    return _predict_each(fn, inputs, plan, rows)


def _predict_each(fn: Any, inputs: Mapping[str, np.ndarray], plan: ServingPlan, rows: int) -> dict[str, np.ndarray]:
    """:func:`predict` one ``plan.batch_size`` slice at a time, from Python."""
    import tensorflow as tf

    dtypes = {b.tensor: b.dtype for b in plan.inputs}
    parts: dict[str, list[np.ndarray]] = {o.tensor: [] for o in plan.outputs}
    for start in range(0, rows, plan.batch_size):
        stop = min(start + plan.batch_size, rows)
        feed = {}
        for name, values in inputs.items():
            tensor = tf.convert_to_tensor(values[start:stop])
            feed[name] = tensor if tensor.dtype.name == dtypes[name] else tf.cast(tensor, dtypes[name])
        result = fn(**feed)
        for o in plan.outputs:
            value = result[o.tensor].numpy()
            if value.ndim == 0 or value.shape[0] != stop - start:
                raise ConfigError(
                    f"signature output {o.tensor!r} returned shape {list(value.shape)} "
                    f"for a batch of {stop - start} rows; TFModel needs one output row "
                    "per input row (a leading batch dimension)"
                )
            parts[o.tensor].append(value)
    return {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in parts.items()}


def _nest(flat: Any, shape: tuple[int, ...]) -> Any:
    """Wrap flat Arrow values into list levels for each non-batch dimension of ``shape``."""
    import pyarrow as pa

    result = flat
    for level in range(len(shape) - 1, 0, -1):
        lists = math.prod(shape[:level])
        offsets = pa.array(np.arange(lists + 1, dtype=np.int32) * shape[level])
        result = pa.ListArray.from_arrays(offsets, result)
    return result


def outputs_to_arrow(values: np.ndarray, o: OutputBinding) -> Any:
    """One output's values (batch-major numpy) as the Arrow array of its column."""
    import pyarrow as pa

    numpy_type, _ = OUTPUT_TYPES[o.dtype]
    flat_values = values.reshape(-1)
    if o.dtype == "string":
        flat = pa.array(
            [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat_values], type=pa.string()
        )
    else:
        flat = pa.array(flat_values.astype(numpy_type, copy=False))
    return _nest(flat, values.shape)


class LoadedSignature:
    """A signature function with the loaded SavedModel object that must outlive it."""

    def __init__(self, saved_model: Any, fn: Any) -> None:
        self.saved_model = saved_model  # the signature's variables live as long as this object
        self.fn = fn
        self._loops: dict[tuple[Any, ...], Any] = {}  # traced batch loops, by what they are fed
        self._lock = threading.Lock()

    def __call__(self, **inputs: Any) -> Any:
        return self.fn(**inputs)

    def batched(self, inputs: Mapping[str, np.ndarray], plan: ServingPlan, rows: int) -> dict[str, np.ndarray] | None:
        """The outputs of every ``plan.batch_size`` slice of ``inputs``, from one graph call;
        None where the graph fails or an output is not one row per input row."""
        import tensorflow as tf

        layout = _layout_of(inputs)
        loop = self._loop(plan, layout)
        if loop is None:
            return None
        result = _or_none(lambda: loop(*[tf.convert_to_tensor(inputs[n]) for n, _, _ in layout]))
        outputs = None if result is None else {o.tensor: result[o.tensor].numpy() for o in plan.outputs}
        if outputs is None or any(v.ndim == 0 or v.shape[0] != rows for v in outputs.values()):
            self._loops[_loop_key(plan, layout)] = None  # batch by batch from now on
            return None
        return outputs

    def prepare(self, plan: ServingPlan) -> None:
        """Trace the batch loop now, at load, where the signature fixes every input's dtype and
        per-row shape (what its columns are cast and reshaped to); else at the first batch."""
        layout = []
        for b in sorted(plan.inputs, key=lambda b: b.tensor):
            numpy = "object" if b.dtype == "string" else INPUT_NUMPY.get(b.dtype)
            if numpy is None or b.shape is None or any(d is None for d in b.shape[1:]):
                return
            layout.append((b.tensor, np.dtype(numpy), tuple(d for d in b.shape[1:] if d is not None)))
        self._loop(plan, layout)

    def _loop(self, plan: ServingPlan, layout: list[tuple[str, np.dtype, tuple[int, ...]]]) -> Any:
        """The traced loop for inputs of ``layout`` (name, dtype, per-row shape), or None."""
        key = _loop_key(plan, layout)
        with self._lock:  # a Python worker may serve from several threads
            if key not in self._loops:
                self._loops[key] = _or_none(lambda: self._trace(layout, plan))
            return self._loops[key]

    def _trace(self, layout: list[tuple[str, np.dtype, tuple[int, ...]]], plan: ServingPlan) -> Any:
        """A graph looping over ``plan.batch_size`` slices of its inputs, concatenating the outputs."""
        import tensorflow as tf

        wanted = {b.tensor: tf.as_dtype(b.dtype) for b in plan.inputs}
        size = plan.batch_size
        names = [n for n, _, _ in layout]
        specs = [tf.TensorSpec([None, *shape], tf.as_dtype(dtype), name=n) for n, dtype, shape in layout]
        out_types = {k: v.dtype for k, v in self.fn.structured_outputs.items()}
        fn = self.fn

        def loop(*tensors: Any) -> dict[str, Any]:
            rows = tf.shape(tensors[0])[0]
            count = (rows + size - 1) // size
            parts = {k: tf.TensorArray(t, size=count, infer_shape=False) for k, t in out_types.items()}
            for i in tf.range(count):
                feed = {n: tf.cast(t[i * size : (i + 1) * size], wanted[n]) for n, t in zip(names, tensors)}
                out = fn(**feed)
                parts = {k: ta.write(i, out[k]) for k, ta in parts.items()}
            return {k: ta.concat() for k, ta in parts.items()}

        return tf.function(loop, input_signature=specs).get_concrete_function()


def _layout_of(inputs: Mapping[str, np.ndarray]) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(name, dtype, per-row shape) of each input, by name."""
    return [(n, inputs[n].dtype, inputs[n].shape[1:]) for n in sorted(inputs)]


def _loop_key(plan: ServingPlan, layout: list[tuple[str, np.dtype, tuple[int, ...]]]) -> tuple[Any, ...]:
    return (plan.batch_size, *((n, dtype.str, tuple(shape)) for n, dtype, shape in layout))


def _or_none(make: Any) -> Any:
    """``make()``, or None where it raises (logged; the caller falls back to batch-by-batch calls,
    which raise the error that names the output or input)."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001
        log.debug("one-graph batches failed (%s: %s); calling batch by batch", type(exc).__name__, exc)
        return None


def _load(plan: ServingPlan) -> LoadedSignature:
    """``tf.saved_model.load`` the plan's SavedModel and pick its signature."""
    import tensorflow as tf

    saved_model = tf.saved_model.load(plan.export_dir, tags=list(plan.tags) if plan.tags else None)
    loaded = LoadedSignature(saved_model, saved_model.signatures[plan.signature_def_key])
    loaded.prepare(plan)  # part of loading, as a serving system warms a model up
    return loaded


def load_signature(plan: ServingPlan) -> LoadedSignature:
    """The plan's signature, loaded at most once per Python worker (cached under ``plan.model_key``)."""
    return ModelCache.get_or_load(plan.model_key, lambda: _frozen_after(lambda: _load(plan)))


def _frozen_after(load: Callable[[], T]) -> T:
    """``load()``; in a Spark task, then move every object alive out of the cyclic GC's sight.

    A reused PySpark worker runs a full ``gc.collect()`` after every task. With TensorFlow
    imported and a model loaded that walks ~420k objects: ~0.2 s a task, measured at a third of
    a TFModel worker's CPU (0.8 us a row of a 1,000,000-row, 4-partition pass). Frozen objects
    are never collected, so each load first unfreezes (a model the cache dropped since becomes
    collectable again) and collects once after loading; objects made later are collected as
    usual. Outside a Spark task (a test, the driver) nothing is frozen. In a task, the load,
    TensorFlow's import in that worker included, runs as a TF process's (:mod:`tfonspark.tfimport`).
    """
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return load()
    gc.unfreeze()
    with importing_tensorflow():
        value = load()
    gc.collect()
    gc.freeze()
    return value


def _empty_outputs(plan: ServingPlan) -> dict[str, np.ndarray]:
    """Zero-row outputs (unknown dimensions as 0) for an empty record batch."""
    return {
        o.tensor: np.zeros(
            (0, *[d or 0 for d in o.shape[1:]]), dtype=object if o.dtype == "string" else OUTPUT_TYPES[o.dtype][0]
        )
        for o in plan.outputs
    }


def _serve(
    arrays: list[Any], plan: ServingPlan, partition: int, first_row: int, fn: Any
) -> tuple[dict[str, np.ndarray], Any]:
    """Outputs for one batch of input arrays (in ``plan.inputs`` order); loads the model once."""
    rows = len(arrays[0]) if arrays else 0
    if rows == 0:
        return _empty_outputs(plan), fn
    fn = fn or load_signature(plan)
    inputs = {b.tensor: column_array(a, b, partition, first_row) for b, a in zip(plan.inputs, arrays)}
    return predict(fn, inputs, plan, rows), fn


def _partition() -> int:
    from pyspark import TaskContext

    task = TaskContext.get()
    return task.partitionId() if task is not None else 0


def serve_arrays(items: Iterator[Any], plan: ServingPlan) -> Iterator[Any]:
    """Scalar-iterator Arrow UDF: input columns in, the output column (a struct if several) out.

    Only the mapped columns travel to Python and only the outputs travel back; Spark keeps the
    other columns on the JVM side.
    """
    partition, first_row, fn = _partition(), 0, None
    for item in items:
        arrays = list(item) if isinstance(item, (tuple, list)) else [item]
        outputs, fn = _serve(arrays, plan, partition, first_row, fn)
        yield output_array(plan, outputs)
        first_row += len(arrays[0])


def output_array(plan: ServingPlan, outputs: Mapping[str, np.ndarray]) -> Any:
    """The UDF result: the single output's array, or a struct of one field per output column."""
    import pyarrow as pa

    arrays = [outputs_to_arrow(outputs[o.tensor], o) for o in plan.outputs]
    if len(arrays) == 1:
        return arrays[0]
    return pa.StructArray.from_arrays(arrays, names=[o.column for o in plan.outputs])


def serve_batches(batches: Iterator[Any], plan: ServingPlan) -> Iterator[Any]:
    """``mapInArrow`` function (Spark without Arrow UDFs): each batch with the outputs appended."""
    import pyarrow as pa

    partition, first_row, fn = _partition(), 0, None
    for batch in batches:
        arrays = [batch.column(b.column) for b in plan.inputs]
        outputs, fn = _serve(arrays, plan, partition, first_row, fn)
        columns = list(batch.columns) + [outputs_to_arrow(outputs[o.tensor], o) for o in plan.outputs]
        names = list(batch.schema.names) + [o.column for o in plan.outputs]
        yield pa.RecordBatch.from_arrays(columns, names=names)
        first_row += batch.num_rows
