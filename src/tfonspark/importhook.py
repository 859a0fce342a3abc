"""Run a function on a library module as soon as it is imported.

Two places patch a module that a program may import only later: the TF port hand-over
(:mod:`tfonspark.tfprocess.server` hooks TF's server starts) and the TFoS face's ``lr=`` for
tf_keras optimizers (:mod:`tfonspark._tfos_keras`). An :class:`AfterImport` in ``sys.meta_path``
finds the module with the other finders, lets its own loader run it, then calls ``patch``.
TensorFlow's first import in a TF process also runs inside ``around`` (:mod:`tfonspark.gcpause`).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["AfterImport"]


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``patch(module)`` right after any module named in ``names`` is first executed
    (inside ``around()``, if given)."""

    def __init__(
        self,
        names: Collection[str],
        patch: Callable[[ModuleType], None],
        around: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self.names = names
        self.patch = patch
        self.around = around

    def install(self) -> None:
        """First in ``sys.meta_path`` (once)."""
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, self.patch, self.around)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    """A module's own loader (inside ``around()``), then the patch on the module it made."""

    def __init__(
        self, loader: Any, patch: Callable[[ModuleType], None], around: Callable[[], AbstractContextManager[object]]
    ) -> None:
        self._loader = loader
        self._patch = patch
        self._around = around

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader  # the module keeps its real loader (get_source, resources)
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with self._around():
            self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
