"""Pictures for the demo: training curves and a confusion matrix, drawn off-screen.

matplotlib is imported only when a picture is drawn, and ``matplotlib.pyplot`` never: each
figure is built with the object API on its own Agg canvas, so the caller's backend, open
figures and pyplot state are untouched (their rcParams style still applies). The format follows
the file's suffix (``.png`` when there is none).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["confusion_matrix", "save_confusion_matrix", "save_training_curves"]

_VAL_PREFIX = "val_"
_MAX_ANNOTATED_CLASSES = 30  # beyond this, numbers in cells are unreadable


def confusion_matrix(
    y_true: np.ndarray | Sequence[int], y_pred: np.ndarray | Sequence[int], num_classes: int
) -> np.ndarray:
    """Counts (int64, num_classes x num_classes): ``[i, j]`` = samples of class i predicted as j."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive int. Received: num_classes={num_classes!r}")
    true = _as_labels(y_true, "y_true", num_classes)
    pred = _as_labels(y_pred, "y_pred", num_classes)
    if true.shape != pred.shape:
        raise ConfigError(
            f"y_true and y_pred must have the same length. Received: len(y_true)={len(true)}, len(y_pred)={len(pred)}"
        )
    counts = np.bincount(true * num_classes + pred, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes)


def _as_labels(values: np.ndarray | Sequence[int], name: str, num_classes: int) -> np.ndarray:
    """A 1-D int64 array of class indices in ``[0, num_classes)``."""
    array = np.asarray(values)
    if array.ndim != 1:
        hint = " (for scores or probabilities pass their argmax(axis=1))" if array.ndim == 2 else ""
        raise ConfigError(f"{name} must be 1-D class indices{hint}. Received: {name}.shape={array.shape}")
    if array.size == 0:
        return array.astype(np.int64)
    if array.dtype.kind not in "biuf" or (array.dtype.kind == "f" and not np.all(array == np.rint(array))):
        raise ConfigError(f"{name} must hold integer class indices. Received: dtype={array.dtype}")
    labels = array.astype(np.int64)
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= num_classes:
        raise ConfigError(f"{name} holds class indices outside [0, {num_classes}). Received: min={low}, max={high}")
    return labels


def save_confusion_matrix(
    y_true: np.ndarray | Sequence[int],
    y_pred: np.ndarray | Sequence[int],
    path: str | os.PathLike[str],
    class_names: Sequence[str] | None = None,
    *,
    normalize: bool = False,
    title: str = "Confusion matrix",
    dpi: int = 120,
) -> Path:
    """Draw the confusion matrix (rows: true class, columns: predicted) to ``path``; return it.

    ``normalize=True`` shows each row as fractions of its true class instead of counts. Without
    ``class_names`` the classes are ``0 .. max label``.
    """
    num_classes = len(class_names) if class_names else _infer_num_classes(y_true, y_pred)
    names = [str(n) for n in class_names] if class_names else [str(i) for i in range(num_classes)]
    counts = confusion_matrix(y_true, y_pred, num_classes)
    total = int(counts.sum())
    accuracy = np.trace(counts) / total if total else float("nan")
    values = _row_fractions(counts) if normalize else counts

    size = max(5.0, 0.55 * num_classes + 2.5)
    fig = _new_figure((size + 1.0, size))
    ax = fig.add_subplot()
    image = ax.imshow(values, cmap="Blues", interpolation="nearest", vmin=0)
    fig.colorbar(image, ax=ax, label="fraction of true class" if normalize else "count")
    _label_classes(ax, names)
    if num_classes <= _MAX_ANNOTATED_CLASSES:
        _annotate_cells(ax, values, normalize)
    ax.set_title(f"{title}\naccuracy {accuracy:.1%} on {total} samples")
    return _save(fig, path, dpi)


def _infer_num_classes(y_true: np.ndarray | Sequence[int], y_pred: np.ndarray | Sequence[int]) -> int:
    """One more than the largest label in either array (at least 1)."""
    largest = [int(np.max(a)) for a in (np.asarray(y_true), np.asarray(y_pred)) if np.size(a)]
    return max(largest, default=0) + 1


def _row_fractions(counts: np.ndarray) -> np.ndarray:
    """Each row divided by its sum; rows without samples stay zero."""
    sums = counts.sum(axis=1, keepdims=True)
    fractions: np.ndarray = np.divide(counts, sums, out=np.zeros(counts.shape), where=sums > 0)
    return fractions


def _label_classes(ax: Axes, names: list[str]) -> None:
    """Class names on both axes, x labels slanted when they are long."""
    ticks = np.arange(len(names))
    slanted = max((len(n) for n in names), default=0) > 3
    ax.set_xticks(ticks, names, rotation=45 if slanted else 0, ha="right" if slanted else "center")
    ax.set_yticks(ticks, names)
    ax.set_xlabel("Predicted label")
    ax.set_ylabel("True label")


def _annotate_cells(ax: Axes, values: np.ndarray, normalize: bool) -> None:
    """Write each cell's value, white on dark cells."""
    threshold = values.max() / 2 if values.size else 0
    for (row, col), value in np.ndenumerate(values):
        text = f"{value:.2f}" if normalize else f"{int(value)}"
        color = "white" if value > threshold else "black"
        ax.text(col, row, text, ha="center", va="center", color=color, fontsize=8)


def save_training_curves(
    history: Mapping[str, Sequence[float]],
    path: str | os.PathLike[str],
    *,
    title: str = "Training curves",
    dpi: int = 120,
) -> Path:
    """Draw one panel per metric (loss first) against epoch, train and ``val_`` lines; return ``path``.

    ``history`` is shaped like Keras' ``History.history``: ``{"loss": [...], "val_loss": [...],
    "accuracy": [...], ...}``.
    """
    panels = _metric_panels(history)
    fig = _new_figure((4.5 * len(panels) + 0.5, 4.0))
    for ax, (metric, (train, val)) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels.items(), strict=True):
        _plot_metric(ax, metric, train, val)
    fig.suptitle(title)
    return _save(fig, path, dpi)


def _metric_panels(
    history: Mapping[str, Sequence[float]],
) -> dict[str, tuple[list[float] | None, list[float] | None]]:
    """``{metric: (train values, val values)}``, loss first, then metrics in the order given."""
    if not isinstance(history, Mapping) or not history:
        raise ConfigError(
            "history must be a non-empty mapping of metric name to per-epoch values, like "
            f"keras History.history. Received: {type(history).__name__} {history!r:.80}"
        )
    panels: dict[str, tuple[list[float] | None, list[float] | None]] = {}
    for key, raw in history.items():
        values = _as_values(key, raw)
        is_val = key.startswith(_VAL_PREFIX) and len(key) > len(_VAL_PREFIX)
        metric = key[len(_VAL_PREFIX) :] if is_val else key
        train, val = panels.get(metric, (None, None))
        panels[metric] = (train, values) if is_val else (values, val)
    order = sorted(panels, key=lambda m: m != "loss")  # stable: the rest keep their order
    return {metric: panels[metric] for metric in order}


def _as_values(key: str, raw: Sequence[float]) -> list[float]:
    """A metric's per-epoch values as floats; at least one."""
    try:
        values = [float(v) for v in raw]
    except (TypeError, ValueError) as err:
        raise ConfigError(f"history[{key!r}] must be a sequence of numbers. Received: {raw!r:.80}") from err
    if not values:
        raise ConfigError(f"history[{key!r}] has no values")
    return values


def _plot_metric(ax: Axes, metric: str, train: list[float] | None, val: list[float] | None) -> None:
    """One panel: the metric per epoch (epochs count from 1)."""
    from matplotlib.ticker import MaxNLocator

    for values, label, style in ((train, "train", "o-"), (val, "validation", "s--")):
        if values is not None:
            epochs = np.arange(1, len(values) + 1)
            ax.plot(epochs, values, style, label=label, markersize=4 if len(values) <= 50 else 0)
    name = metric.replace("_", " ")
    ax.set_title(name.capitalize())
    ax.set_xlabel("Epoch")
    ax.set_ylabel(name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()


def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure on its own Agg canvas, unknown to pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: str | os.PathLike[str], dpi: int) -> Path:
    """Write ``fig`` in the format named by the suffix, creating parent directories."""
    target = Path(path)
    fmt = target.suffix[1:].lower() or "png"
    supported = fig.canvas.get_supported_filetypes()
    if fmt not in supported:
        raise ConfigError(
            f"cannot save a figure as {fmt!r}; use one of the suffixes {', '.join(sorted(supported))}. "
            f"Received: path={os.fspath(path)!r}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, format=fmt, dpi=dpi)
    return target
