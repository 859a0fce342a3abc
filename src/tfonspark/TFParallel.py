"""TFoS-compatible face: ``TFParallel.run(sc, map_fn, tf_args, num_executors, use_barrier)``.

Independent TF instances on executors (e.g. batch inference); see :mod:`tfonspark.driver.parallel`.
"""

from __future__ import annotations

from .driver.parallel import run

__all__ = ["run"]
