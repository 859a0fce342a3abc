"""Run a function on a library module as soon as it is imported, or defer a module to its first use.

Two places patch a module that a program may import only later: the TF port hand-over
(:mod:`tfonspark.ports` hooks TF's server starts) and the TFoS face's ``lr=`` for
tf_keras optimizers (:mod:`tfonspark._tfos_keras`). An :class:`AfterImport` in ``sys.meta_path``
finds the module with the other finders, lets its own loader run it, then calls ``patch``.
TensorFlow's first import in a TF process also runs inside ``around`` (:mod:`tfonspark.tfimport`),
where a :class:`Deferred` finder makes two modules that Keras imports lazy.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["AfterImport", "Deferred"]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds only the modules named in ``names``: the spec the other finders in ``sys.meta_path``
    find, its loader wrapped by :meth:`wrap`."""

    names: Collection[str]

    def wrap(self, loader: Any) -> importlib.abc.Loader:
        raise NotImplementedError

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
                    spec.loader = self.wrap(spec.loader)
                return spec
        return None


class AfterImport(_Finder):
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

    def wrap(self, loader: Any) -> importlib.abc.Loader:
        return _PatchingLoader(loader, self.patch, self.around)


class Deferred(_Finder):
    """While :meth:`active`, an import of a module named in ``names`` makes it lazy: the module
    object exists at once, its code runs when an attribute other than its import metadata is
    first read (:class:`_DeferredModule`).

    Not :class:`importlib.util.LazyLoader`: its modules run on any attribute read, and
    ``inspect.getmodule``, which TensorFlow's autograph calls on every function it converts, reads
    ``__file__`` of every module in ``sys.modules``.
    """

    def __init__(self, names: Collection[str]) -> None:
        self.names = names

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """First in ``sys.meta_path`` inside the block (for modules not imported yet)."""
        sys.meta_path.insert(0, self)
        try:
            yield
        finally:
            self.remove()

    def wrap(self, loader: Any) -> importlib.abc.Loader:
        return _DeferringLoader(loader)


#: what the import system and ``inspect`` read of a module without using it
_METADATA = frozenset(
    ("__class__", "__name__", "__file__", "__spec__", "__loader__", "__package__", "__path__", "__cached__")
)
#: per deferred module (by name): its lock, and whether its code is running (in the lock's thread)
_LOCKS: dict[str, threading.RLock] = {}
_RUNNING: set[str] = set()


class _DeferredModule(ModuleType):
    """A module whose code has not run yet: reading any attribute but its metadata runs it."""

    def __getattribute__(self, name: str) -> Any:
        if name not in _METADATA:
            _run(self)
        return ModuleType.__getattribute__(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        _run(self)
        ModuleType.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        _run(self)
        ModuleType.__delattr__(self, name)


def _run(module: ModuleType) -> None:
    """Run a deferred module's code once: other threads wait for it; the running thread itself
    (its code reading or setting the module's attributes) goes on, as in any import."""
    name = object.__getattribute__(module, "__name__")
    with _LOCKS.get(name) or contextlib.nullcontext():
        if type(module) is not _DeferredModule or name in _RUNNING:
            return
        _RUNNING.add(name)
        spec = object.__getattribute__(module, "__spec__")
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)  # as a failed import leaves it: the next import tries again
            raise
        finally:
            _RUNNING.discard(name)
            object.__setattr__(module, "__class__", ModuleType)
            _LOCKS.pop(name, None)


class _DeferringLoader(importlib.abc.Loader):
    """A module's own loader, run by :func:`_run` at the module's first use instead of now."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _LOCKS[module.__name__] = threading.RLock()
        module.__class__ = _DeferredModule

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


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
