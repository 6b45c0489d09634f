"""One registry helper: implementations of one kind, chosen by name (as timm's model registry).

``Registry(kind)`` maps a name to an object (a class, a backend). :meth:`Registry.register` adds
one, :meth:`Registry.get` returns it or raises ONE ValueError line that names the registered ones,
:meth:`Registry.names` lists them in registration order (what a params schema checks a
configured name against). An entry may be lazy, a ``"module:Attr"`` path imported on first
:meth:`~Registry.get` (relative to the registry's ``package``), so listing the names or looking up
one family imports no other family's library. Names in ``reserved`` (``auto`` for the compile
backends: it chooses among them) cannot be registered.

Used by every registry of the library: ``hydra_ops.adapters.FAMILIES``,
``hydra_ops.hydra.grouped.ATTENTION_IMPLEMENTATIONS``, ``hydra_ops.compile.BACKEND_REGISTRY``,
``hydra_ops.scoring.SCORERS``. This module imports nothing (no torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """``name -> T`` in registration order; ``name in reg``, ``reg[name]``, ``list(reg)``.

    Args:
        kind: what an entry is, for messages (``"attention"``, ``"backend"``...).
        package: the package a lazy entry's ``".module:Attr"`` path is relative to.
        reserved: names that cannot be registered.

    Invariant: a name is registered at most once; :meth:`get` of a registered name returns the
    same object every time (a lazy entry is imported once and kept).
    """

    def __init__(
        self, kind: str, *, package: str | None = None, reserved: Iterable[str] = ()
    ) -> None:
        self.kind = kind
        self._package = package
        self._reserved = tuple(reserved)
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str] = {}

    # ----- registering ----------------------------------------------------------------------
    def _check_new(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if name in self._reserved:
            raise ValueError(f"{self.kind} name {name!r} is reserved")
        if name in self:
            raise ValueError(
                f"{self.kind} {name!r} is already registered; registered: {', '.join(self)}"
            )

    def register(self, name: str, obj: T) -> T:
        """Add ``obj`` under ``name``, return it; ValueError if the name is taken or reserved."""
        self._check_new(name)
        self._entries[name] = obj
        return obj

    def register_lazy(self, name: str, path: str) -> None:
        """Add ``name`` as a ``"module:Attr"`` path, imported on first :meth:`get`."""
        self._check_new(name)
        if ":" not in path:
            raise ValueError(f"a lazy {self.kind} path is 'module:Attr', got {path!r}")
        self._entries[name] = None  # type: ignore[assignment]  # the place keeps the order
        self._lazy[name] = path

    def unregister(self, name: str) -> T:
        """Remove ``name`` (what a test registered) and return what it held."""
        obj = self.get(name)
        del self._entries[name]
        return obj

    # ----- looking up -------------------------------------------------------------------------
    def unknown(self, name: object, argument: str | None = None, also: Iterable[str] = ()) -> str:
        """The one-line message for a name that is not registered (``also``: other values the
        caller accepts, listed first)."""
        allowed = ", ".join([*also, *self])
        return f"{argument or self.kind}={name!r} is unknown; registered: {allowed}"

    def get(self, name: str, argument: str | None = None) -> T:
        """The object registered as ``name``; ValueError naming the registered ones otherwise
        (``argument``: the parameter the name came from, for the message)."""
        if name not in self:
            raise ValueError(self.unknown(name, argument))
        if name in self._lazy:
            module, _, attr = self._lazy.pop(name).partition(":")
            self._entries[name] = getattr(importlib.import_module(module, self._package), attr)
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order (nothing is imported)."""
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        """``(name, object)`` pairs in registration order (lazy entries imported)."""
        return ((name, self.get(name)) for name in self.names())

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self)})"
