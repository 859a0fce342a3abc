"""``ModelBuilder``: a model's input, inference, training, evaluation and output, in TF 2 terms.

TensorFX's builder made TF 1 graphs (a graph, its tensors and ops) for training, evaluation and
prediction. In TF 2 the same five methods make one Keras model and what surrounds it:

* ``build_input(source, batch, epochs, shuffle)``: a ``tf.data.Dataset`` of ``(inputs,
  labels)`` batches; ``inputs`` a tensor or a dict keyed by feature name. Its element spec
  gives the model's ``keras.Input``\\ s (named after the features);
* ``build_inference(inputs, training)``: the inference values, from those symbolic inputs;
  called once, so the trained and the served model share their layers (``training`` is None:
  Keras passes the flag to layers such as Dropout at call time);
* ``build_training(global_steps, inputs, inferences)``: ``(loss, optimizer)`` for
  ``model.compile``. TF 1's global-step variable is the optimizer's ``iterations`` in TF 2;
  ``global_steps`` is the number of training steps planned (for learning-rate schedules);
* ``build_evaluation(inputs, outputs)``: the Keras metrics (default: none);
* ``build_output(inferences)``: the named outputs the SavedModel serves (default:
  ``{"output_0": inferences}``); :class:`tfonspark.ml.TFModel` maps them to columns.

``build_input``, ``build_inference`` and ``build_training`` are required: a subclass lacking
one is refused when constructed, with a ConfigError naming the class and the method.
``build_training_graph``/``build_evaluation_graph``/``build_prediction_graph`` return the
"graph interfaces": the compiled model and a ``tf.function`` train step, the eval step, and the
serving model with its signature. ``build_graph_interfaces(config)`` builds all three under
the configuration's strategy scope. ``build_init`` is gone: TF 2 variables are initialised
when created, and restored by the trainer's checkpoints.

``dataset`` maps source names (``"train"``, ``"eval"``) to rows: a ``tf.data.Dataset`` of
unbatched examples, a tuple or dict of arrays, or a callable returning a ``tf.data.Dataset``
(reading files, say). :meth:`ModelBuilder.rows` turns one into a dataset; on a tfonspark node
the trainer replaces the sources by this node's share (a shard, or the Spark feed's rows).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from ..errors import ConfigError, InputError

__all__ = ["EvaluationGraph", "ModelBuilder", "PredictionGraph", "TrainingGraph"]

#: the methods a subclass must define
REQUIRED = ("build_input", "build_inference", "build_training")


@dataclass(frozen=True)
class TrainingGraph:
    """The training interface: the compiled model, its train step and the planned steps."""

    model: Any
    step: Callable[[Any], Any]
    global_steps: int


@dataclass(frozen=True)
class EvaluationGraph:
    """The evaluation interface: the compiled model and its eval step (``model.test_step``)."""

    model: Any
    step: Callable[[Any], Any]


@dataclass(frozen=True)
class PredictionGraph:
    """The prediction interface: the serving model, its signature and the input signature."""

    model: Any
    signature: Callable[[Any], Any]
    input_signature: Any


class ModelBuilder:
    """Builds a model for training, evaluation and prediction; subclass it (module docstring).

    Parameters
    ----------
    args : ModelArguments
        The model's arguments (``batch_size``, ``epochs``, ``learning_rate`` and the model's own).
    dataset : Mapping
        Source name -> rows: a ``tf.data.Dataset``, arrays, or a callable returning a dataset.

    Raises
    ------
    ConfigError
        When the subclass lacks ``build_input``, ``build_inference`` or ``build_training``.

    Examples
    --------
    >>> class Linear(ModelBuilder):
    ...     def build_input(self, source, batch, epochs, shuffle):
    ...         return self.rows(source).batch(batch)
    ...     def build_inference(self, inputs, training):
    ...         return keras.layers.Dense(1)(inputs)
    ...     def build_training(self, global_steps, inputs, inferences):
    ...         return "mse", keras.optimizers.SGD(0.1)
    >>> import numpy as np
    >>> from tfonspark.tensorfx import ModelArguments
    >>> x = np.ones((8, 2), "float32")
    >>> builder = Linear(ModelArguments.default(), {"train": (x, x[:, :1])})
    >>> builder.build_training_graph().model.output.shape
    (None, 1)
    """

    def __init__(self, args: Any, dataset: Mapping[str, Any] | None = None) -> None:
        missing = [name for name in REQUIRED if getattr(type(self), name) is getattr(ModelBuilder, name)]
        if missing:
            signatures = ", ".join(f"{name}({_parameters(getattr(ModelBuilder, name))})" for name in missing)
            raise ConfigError(
                f"{type(self).__name__} does not define {signatures}: a ModelBuilder subclass must "
                f"define {', '.join(REQUIRED)}"
            )
        self._args = args
        self._dataset = dict(dataset or {})
        self._built: tuple[Any, Any, int] | None = None

    @property
    def args(self) -> Any:
        """The arguments of this training (a ``ModelArguments``): ``builder.args.batch_size``."""
        return self._args

    @property
    def dataset(self) -> dict[str, Any]:
        """Source name -> rows (``builder.dataset["train"]``), as given or as the trainer set them."""
        return dict(self._dataset)

    def with_dataset(self, dataset: Mapping[str, Any]) -> ModelBuilder:
        """A copy of this builder reading other sources (the trainer's view of one node's data).

        Parameters
        ----------
        dataset : Mapping
            Sources to replace or add; the others are kept.

        Returns
        -------
        ModelBuilder
            A shallow copy, with nothing built yet.

        Examples
        --------
        >>> node_builder = builder.with_dataset({"train": feed_rows})  # doctest: +SKIP
        """
        other = copy.copy(self)
        vars(other).update(_dataset={**self._dataset, **dataset}, _built=None)
        return other

    def rows(self, source: str) -> tf.data.Dataset:
        """The unbatched examples of the source named ``source``, as a ``tf.data.Dataset``.

        Parameters
        ----------
        source : str
            A key of :attr:`dataset` (``"train"``, ``"eval"``).

        Returns
        -------
        tf.data.Dataset
            The source itself, ``from_tensor_slices`` of arrays, or what a callable returns.

        Raises
        ------
        InputError
            When there is no such source, or a callable returns something else.

        Examples
        --------
        >>> [int(v) for v in Linear(ModelArguments.default(), {"train": [1, 2]}).rows("train")]  # doctest: +SKIP
        [1, 2]
        """
        if source not in self._dataset:
            raise InputError(f"{type(self).__name__} has no data source {source!r}. Available: {sorted(self._dataset)}")
        data = self._dataset[source]
        if isinstance(data, tf.data.Dataset):
            return data
        if callable(data):
            made = data()
            if not isinstance(made, tf.data.Dataset):
                raise InputError(
                    f"data source {source!r} of {type(self).__name__} returned {type(made).__name__}, "
                    "not a tf.data.Dataset"
                )
            return made
        return tf.data.Dataset.from_tensor_slices(data)

    # -- the five methods -------------------------------------------------------------------

    def build_input(self, source: str, batch: int, epochs: int | None, shuffle: bool) -> tf.data.Dataset:
        """The input: a dataset of ``(inputs, labels)`` batches read from ``source`` (required).

        Parameters
        ----------
        source : str
            The data source's name (``"train"``, ``"eval"``); read it with :meth:`rows`.
        batch : int
            Examples per batch (this node's share of the global batch).
        epochs : int or None
            Passes over the data; None: repeat forever. The trainer passes 1 (it counts epochs),
            or None for training data whose epochs are a number of steps (on a cluster in
            ``InputMode.TENSORFLOW``; alone with ``--steps-per-epoch``).
        shuffle : bool
            Whether to shuffle (True for training).

        Returns
        -------
        tf.data.Dataset
            ``(inputs, labels)`` batches; ``inputs`` a tensor or a dict keyed by feature name.

        Examples
        --------
        >>> def build_input(self, source, batch, epochs, shuffle):  # doctest: +SKIP
        ...     rows = self.rows(source)
        ...     return (rows.shuffle(10_000) if shuffle else rows).repeat(epochs).batch(batch)
        """
        raise NotImplementedError

    def build_inference(self, inputs: Any, training: bool | None) -> Any:
        """The inference values from the symbolic ``inputs`` (required): Keras layers applied.

        Parameters
        ----------
        inputs : keras.KerasTensor or dict
            One ``keras.Input`` per feature (a dict when ``build_input`` yields dicts).
        training : bool or None
            None: one model serves training and prediction, and Keras sets the flag per call.

        Returns
        -------
        keras.KerasTensor or nested structure
            The model's outputs (logits, say).

        Examples
        --------
        >>> def build_inference(self, inputs, training):  # doctest: +SKIP
        ...     return keras.layers.Dense(10)(inputs["image"])
        """
        raise NotImplementedError

    def build_training(self, global_steps: int, inputs: Any, inferences: Any) -> tuple[Any, Any]:
        """The loss and the optimizer the model is compiled with (required).

        Parameters
        ----------
        global_steps : int
            Training steps planned (epochs x steps per epoch; 0 when unknown), for schedules.
        inputs : keras.KerasTensor or dict
            The symbolic inputs.
        inferences : keras.KerasTensor or nested structure
            What :meth:`build_inference` returned.

        Returns
        -------
        tuple
            ``(loss, optimizer)``: a Keras loss (or its name) and a Keras optimizer.

        Examples
        --------
        >>> def build_training(self, global_steps, inputs, inferences):  # doctest: +SKIP
        ...     return keras.losses.SparseCategoricalCrossentropy(from_logits=True), keras.optimizers.Adam()
        """
        raise NotImplementedError

    def build_evaluation(self, inputs: Any, outputs: Any) -> list[Any]:
        """The Keras metrics evaluated in training and evaluation (default: none).

        Parameters
        ----------
        inputs : keras.KerasTensor or dict
            The symbolic inputs.
        outputs : keras.KerasTensor or nested structure
            The model's outputs (the inferences), which the metrics compare with the labels.

        Returns
        -------
        list
            Metrics or their names, for ``model.compile(metrics=...)``.

        Examples
        --------
        >>> def build_evaluation(self, inputs, outputs):  # doctest: +SKIP
        ...     return ["accuracy"]
        """
        del inputs, outputs
        return []

    def build_output(self, inferences: Any) -> dict[str, Any]:
        """The named outputs the SavedModel serves (default: ``{"output_0": inferences}``).

        Parameters
        ----------
        inferences : keras.KerasTensor or nested structure
            What :meth:`build_inference` returned.

        Returns
        -------
        dict
            Output name -> symbolic tensor (``keras.ops`` on the inferences).

        Examples
        --------
        >>> def build_output(self, inferences):  # doctest: +SKIP
        ...     return {"label": keras.ops.argmax(inferences, axis=-1), "scores": keras.ops.softmax(inferences)}
        """
        return {"output_0": inferences}

    # -- the graph interfaces ----------------------------------------------------------------

    def build_model(self, input_spec: Any, global_steps: int = 0) -> tuple[Any, Any]:
        """The compiled model and the serving model, built once from the input's element spec.

        Call it under the strategy's scope (:meth:`build_graph_interfaces` and the trainer do).

        Parameters
        ----------
        input_spec : tf.TypeSpec or dict
            The element spec of the inputs (the first half of ``build_input``'s elements).
        global_steps : int
            As for :meth:`build_training`.

        Returns
        -------
        tuple
            ``(model, serving_model)``, sharing their layers.

        Examples
        --------
        >>> model, serving = builder.build_model(dataset.element_spec[0], 1000)  # doctest: +SKIP
        """
        if self._built is None:
            inputs = tf.nest.map_structure(_keras_input, input_spec, _names(input_spec))
            inferences = self.build_inference(inputs, None)
            model = keras.Model(inputs, inferences, name=_snake(type(self).__name__))
            loss, optimizer = self.build_training(global_steps, inputs, inferences)
            model.compile(optimizer=optimizer, loss=loss, metrics=self.build_evaluation(inputs, inferences))
            serving = keras.Model(inputs, self.build_output(inferences), name=f"{model.name}_serving")
            self._built = (model, serving, global_steps)
        return self._built[0], self._built[1]

    def build_training_graph(self) -> TrainingGraph:
        """The training interface: the compiled model and a ``tf.function`` of ``model.train_step``.

        Returns
        -------
        TrainingGraph
            ``model``, ``step(batch) -> logs`` (one process; the trainer distributes), ``global_steps``.

        Examples
        --------
        >>> graph = builder.build_training_graph()  # doctest: +SKIP
        >>> logs = graph.step(next(iter(builder.build_input("train", 32, 1, True))))  # doctest: +SKIP
        """
        model, _ = self._model()
        return TrainingGraph(model, tf.function(model.train_step), self._built[2] if self._built else 0)

    def build_evaluation_graph(self) -> EvaluationGraph:
        """The evaluation interface: the compiled model and a ``tf.function`` of ``model.test_step``.

        Returns
        -------
        EvaluationGraph
            ``model`` and ``step(batch) -> logs``.

        Examples
        --------
        >>> logs = builder.build_evaluation_graph().step(batch)  # doctest: +SKIP
        """
        model, _ = self._model()
        return EvaluationGraph(model, tf.function(model.test_step))

    def build_prediction_graph(self) -> PredictionGraph:
        """The prediction interface: the serving model and its signature (named outputs).

        Returns
        -------
        PredictionGraph
            ``model`` (serving), ``signature(inputs) -> {name: tensor}`` and its ``input_signature``.

        Examples
        --------
        >>> outputs = builder.build_prediction_graph().signature(images)  # doctest: +SKIP
        """
        _, serving = self._model()
        spec = serving_input_signature(serving)

        def serve(inputs: Any) -> Any:
            return serving(inputs, training=False)

        return PredictionGraph(serving, tf.function(serve, input_signature=[spec]), spec)

    def build_graph_interfaces(self, config: Any) -> tuple[TrainingGraph, EvaluationGraph, PredictionGraph]:
        """The training, evaluation and prediction interfaces, built under ``config``'s strategy.

        Parameters
        ----------
        config : Configuration
            Where this process trains; its ``create_device_setter`` scope holds the variables.

        Returns
        -------
        tuple
            ``(TrainingGraph, EvaluationGraph, PredictionGraph)``.

        Examples
        --------
        >>> training, evaluation, prediction = builder.build_graph_interfaces(Configuration.local())  # doctest: +SKIP
        """
        with config.create_device_setter(self._args):
            self._model()
            return self.build_training_graph(), self.build_evaluation_graph(), self.build_prediction_graph()

    def _model(self) -> tuple[Any, Any]:
        """The built models; built from the training input's spec when nothing was built yet."""
        if self._built is None:
            sample = self.build_input("train", 1, 1, False)
            return self.build_model(element_inputs(sample, type(self).__name__), 0)
        return self._built[0], self._built[1]


def element_inputs(dataset: Any, owner: str) -> Any:
    """The inputs half of an ``(inputs, labels)`` dataset's element spec; InputError otherwise.

    Parameters
    ----------
    dataset : tf.data.Dataset
        What ``build_input`` returned.
    owner : str
        The builder's class name, for the error.

    Returns
    -------
    tf.TypeSpec or dict
        The inputs' spec.

    Examples
    --------
    >>> element_inputs(tf.data.Dataset.from_tensors((1.0, 2)), "B")
    TensorSpec(shape=(), dtype=tf.float32, name=None)
    """
    spec = getattr(dataset, "element_spec", None)
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise InputError(
            f"{owner}.build_input must return a tf.data.Dataset of (inputs, labels) batches. "
            f"Received: element_spec={spec!r}"
        )
    return spec[0]


def serving_input_signature(model: Any) -> Any:
    """The serving model's input signature: a TensorSpec per input, named as the input.

    Parameters
    ----------
    model : keras.Model
        A functional model.

    Returns
    -------
    tf.TensorSpec or dict
        A dict keyed by input name when the model takes a dict.

    Examples
    --------
    >>> serving_input_signature(keras.Model(i := keras.Input((3,), name="x"), i))
    TensorSpec(shape=(None, 3), dtype=tf.float32, name='x')
    """

    def spec(tensor: Any) -> tf.TensorSpec:
        name = tensor.name.split(":")[0] if tensor.name else None
        return tf.TensorSpec(tensor.shape, tensor.dtype, name=name)

    return tf.nest.map_structure(spec, model.input)


def _parameters(method: Any) -> str:
    """``inputs, training``: a method's parameter names, without ``self``."""
    return ", ".join(list(inspect.signature(method).parameters)[1:])


def _names(spec: Any) -> Any:
    """A structure like ``spec`` holding each component's name (dict key, else "input")."""
    if isinstance(spec, Mapping):
        return {key: str(key) for key in spec}
    return tf.nest.map_structure(lambda _: "input", spec)


def _keras_input(spec: Any, name: str) -> Any:
    """A ``keras.Input`` for one input component (its batch dimension dropped)."""
    if not isinstance(spec, tf.TensorSpec):
        raise InputError(f"build_input's inputs must be dense tensors. Received: {spec!r} for {name!r}")
    return keras.Input(shape=tuple(spec.shape[1:]), dtype=spec.dtype.name, name=name)


def _snake(name: str) -> str:
    """``MnistBuilder`` -> ``mnist_builder`` (a Keras model name)."""
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))
