"""``get_timestamped_export_dir`` as ``tensorflow_estimator`` defined it; nothing else of it.

tf.estimator is gone from TensorFlow >= 2.16; anything else asked of this module raises an
AttributeError that says so and what to use instead.
"""

from __future__ import annotations

import os
import time
from typing import Any

_ATTEMPTS = 10


def get_timestamped_export_dir(export_dir_base: str | bytes) -> bytes:
    """``<export_dir_base>/<unix seconds>`` (as bytes, like the original) that does not exist yet.

    Waits a second and retries when that directory exists; raises RuntimeError after 10 tries.
    """
    base = os.fsencode(export_dir_base)
    for _ in range(_ATTEMPTS):
        candidate = os.path.join(base, str(int(time.time())).encode())
        if not _exists(candidate):
            return candidate
        time.sleep(1)
    raise RuntimeError(f"no unused timestamped directory under {os.fsdecode(base)!r} after {_ATTEMPTS} seconds")


def _exists(path: bytes) -> bool:
    import tensorflow as tf

    return bool(tf.io.gfile.exists(os.fsdecode(path)))  # gfile: the base may be hdfs:// or gs://


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"tensorflow_estimator's export_lib.{name} is not available: tf.estimator was removed in "
        "TensorFlow 2.16 and tfonspark provides only get_timestamped_export_dir for TFoS programs. "
        "Export with tfonspark.compat.export_saved_model(model, export_dir, is_chief)."
    )
