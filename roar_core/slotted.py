"""Small value classes for the modules `roar-core run` imports before its command starts.

Not dataclasses: importing `dataclasses` costs ~5.5 ms (it pulls in inspect, ast, dis and
tokenize) and building each class ~0.45 ms more (its methods are made by exec), together a
third of what a whole `roar-core run true` may add.  A class lists its fields in
`__slots__` and writes its `__init__`; this base gives it what @dataclass would have
given: equality, repr and `replace`.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing is ~1.6 ms of the same budget
if TYPE_CHECKING:
    from typing import Any, Self


class Slotted:
    __slots__ = ()
    # Fields left out of equality and the hash (dataclasses' compare=False).
    _not_compared: tuple[str, ...] = ()

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The field names, base classes' first, in declaration order."""
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            names += klass.__dict__.get("__slots__", ())
        return tuple(names)

    def _compared(self) -> tuple[Any, ...]:
        skip = self._not_compared
        return tuple(getattr(self, n) for n in self.fields() if n not in skip)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._compared() == other._compared()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, like a plain @dataclass

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={getattr(self, n, None)!r}" for n in self.fields())
        return f"{self.__class__.__name__}({shown})"

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed (dataclasses.replace)."""
        new = object.__new__(self.__class__)
        for n in self.fields():
            object.__setattr__(new, n, changes.pop(n) if n in changes else getattr(self, n))
        if changes:
            raise TypeError(f"{self.__class__.__name__} has no field {next(iter(changes))!r}")
        return new

    def __reduce__(self) -> tuple[Any, ...]:
        # Through object.__setattr__: pickle's own way sets slots with setattr, which a
        # Frozen refuses.
        return _rebuild, (self.__class__, tuple(getattr(self, n) for n in self.fields()))


def _rebuild(cls: type[Slotted], values: tuple[Any, ...]) -> Slotted:
    new = object.__new__(cls)
    for n, v in zip(cls.fields(), values, strict=True):
        object.__setattr__(new, n, v)
    return new


class Frozen(Slotted):
    """Immutable and hashable (@dataclass(frozen=True)): `__init__` sets its fields with
    `self._set(...)`."""

    __slots__ = ()

    def _set(self, **values: Any) -> None:
        for n, v in values.items():
            object.__setattr__(self, n, v)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a frozen "
                             f"{self.__class__.__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen "
                             f"{self.__class__.__name__}")

    def __hash__(self) -> int:
        return hash(self._compared())
