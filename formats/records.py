"""``SlotRecord``: the ``__repr__``, ``__eq__`` and ``__hash__`` a dataclass
would give a class, taken from its ``__slots__``.

A dataclass compiles its generated methods from source when its module is
imported (about 1 ms a class); the classes on the loader's import path take
these instead (issue #24). Fields are the ``__slots__``, in order. A mutable
record sets ``__hash__ = None``, as a non-frozen dataclass is unhashable.
"""

from __future__ import annotations


class SlotRecord:
    __slots__ = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(
            f"{name}={getattr(self, name)!r}" for name in self.__slots__) + ")"

    def __eq__(self, other):
        return self._values() == other._values() if other.__class__ is self.__class__ else NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())
