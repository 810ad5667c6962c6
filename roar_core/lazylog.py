"""A module's logger, made when something is first logged: `logging` (with the traceback,
string and threading modules it imports) is ~7 ms of imports that `roar-core run` and a
task process's path never need unless something goes wrong."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's (see roar_core.slotted)
if TYPE_CHECKING:
    from typing import Any


class LazyLogger:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:  # warning, debug, error, exception...
        import logging

        return getattr(logging.getLogger(self._name), attr)
