"""``SlotRecord``: the ``__repr__``, ``__eq__`` and ``__hash__`` a dataclass
would give a class, taken from its ``__slots__``.

A dataclass compiles its generated methods from source when its module is
imported (about 1 ms a class); the classes on the loader's import path take
these instead (issue #24). Fields are the ``__slots__``, in order. A mutable
record sets ``__hash__ = None``, as a non-frozen dataclass is unhashable.
``_hidden`` names slots left out of the repr, ``==`` and the hash (a
dataclass's ``field(repr=False, compare=False)``).

``FrozenSlotRecord``: a ``@dataclass(frozen=True)`` the same way: assigning or
deleting a field raises ``dataclasses.FrozenInstanceError``, ``__init__`` sets
fields with ``self._set``, copies and pickles keep every slot, and
``__match_args__`` is the slots, as a dataclass's is its fields.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError  # dataclasses is imported by torch already: no cost


class SlotRecord:
    __slots__ = ()
    _hidden: tuple = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__ if name not in self._hidden)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(
            f"{name}={getattr(self, name)!r}" for name in self.__slots__ if name not in self._hidden) + ")"

    def __eq__(self, other):
        return self._values() == other._values() if other.__class__ is self.__class__ else NotImplemented

    def __hash__(self) -> int:
        return hash(self._values())


class FrozenSlotRecord(SlotRecord):
    __slots__ = ()

    def _set(self, name: str, value) -> None:
        object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __getstate__(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple) -> None:
        # unpickling and copy.copy set the slots here, past the frozen __setattr__ (not through __init__,
        # whose checks the values passed when they were made)
        for name, value in zip(self.__slots__, state):
            object.__setattr__(self, name, value)
