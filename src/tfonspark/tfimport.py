"""TensorFlow's first import in a TF process (and in a standby or spare), without two costs that
are not TensorFlow's own work.

* The cyclic GC. The import makes ~400k objects that live as long as the process; with the GC
  on, they were traversed and promoted again and again: ~1.2 s more CPU in every TF process
  (``import tensorflow; tf.constant(1)`` in 8 fresh interpreters, 2 cores: median 6.3 against
  5.2 s). The import runs with the GC paused, then freezes (``gc.freeze``) what it made, so
  later collections, in training too, skip it. An import that fails freezes nothing.
* Keras's optional integrations. Keras 3, imported with TensorFlow, imports its scikit-learn
  wrappers (``keras.wrappers``: scikit-learn's base classes) and ``matplotlib.pyplot`` (for
  ``keras.visualization``) whenever those packages are installed, as in most data-science
  environments: 0.8 and 0.6 s of a 4.5 s import here. A node rarely uses either, so during the
  import both modules are made lazy (:class:`~tfonspark.importhook.Deferred`): they run when
  first used, or when ``map_fun`` imports them, as they would have at the import.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from types import ModuleType

from .gcpause import paused
from .importhook import AfterImport, Deferred

__all__ = ["DEFERRED_MODULES", "importing_tensorflow", "prepare_tensorflow_import"]

#: imported by Keras 3 at ``import tensorflow`` when installed, and deferred to their first use
DEFERRED_MODULES = ("keras.wrappers", "matplotlib.pyplot")

_DEFERRED = Deferred(DEFERRED_MODULES)


@contextlib.contextmanager
def importing_tensorflow() -> Iterator[None]:
    """A block that may import TensorFlow first: the GC paused, Keras's optional integrations
    deferred (for a caller that freezes what it made itself, e.g. a TFModel worker's load)."""
    with paused(), _DEFERRED.active():
        yield


def _freeze(_module: ModuleType) -> None:
    gc.freeze()  # O(1): the module's objects move to the permanent generation


_HOOK = AfterImport(("tensorflow",), _freeze, around=importing_tensorflow)


def prepare_tensorflow_import() -> None:
    """Install (once, first in ``sys.meta_path``) the hook around TensorFlow's first import,
    wherever ``map_fun`` or its unpickling makes it. No effect once TF is imported."""
    _HOOK.install()
