"""Keeping the tracer's task tag right while Ray runs a task in pieces.

A generator task is iterated by Ray on the thread that started it, between Ray's own
steps: the tag stays set from the call to the last item.  A coroutine of an async actor
shares the event-loop thread with the actor's other calls: its tag is set for each step it
runs and cleared when it yields to the loop, so interleaved calls never see each other's
tag, and values sent into a generator (`send`, `asend`) are passed on unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from typing import Any

Finish = Callable[[BaseException | None], None]  # called once: None when it went well


class NoShim:
    """Stand-in for the tracer's tag API where the shim is not loaded."""

    def begin(self, tag: str) -> None:
        pass

    def end(self) -> None:
        pass

    def process_tag(self, tag: str | None) -> None:
        pass


class Steps:
    """Await `awaitable` with `tag` set on this thread only while one of its steps runs."""

    __slots__ = ("_awaitable", "_tag", "_shim")

    def __init__(self, awaitable: Any, tag: str, shim: Any):
        self._awaitable, self._tag, self._shim = awaitable, tag, shim

    def __await__(self) -> Generator[Any, Any, Any]:
        inner = self._awaitable
        if not hasattr(inner, "send"):  # a Future or another awaitable: drive its iterator
            inner = inner.__await__()
        shim, tag = self._shim, self._tag
        value: Any = None
        error: BaseException | None = None
        while True:
            shim.begin(tag)
            try:
                out = inner.send(value) if error is None else inner.throw(error)
            except StopIteration as stop:
                return stop.value
            finally:
                shim.end()
            try:
                value, error = (yield out), None
            except GeneratorExit:
                inner.close()
                raise
            except BaseException as e:  # cancellation and the like: the coroutine's to handle
                value, error = None, e


def generator(gen: Generator, finish: Finish) -> Generator:
    """A sync generator task: the caller set the tag; `finish` runs when it is done."""
    try:
        result = yield from gen  # forwards send() and throw() to the task's generator
    except GeneratorExit:  # closed by its consumer before the end: it did what was asked
        finish(None)
        raise
    except BaseException as e:
        finish(e)
        raise
    finish(None)
    return result


async def coroutine(awaitable: Awaitable, tag: str, shim: Any, finish: Finish) -> Any:
    try:
        result = await Steps(awaitable, tag, shim)
    except BaseException as e:
        finish(e)
        raise
    finish(None)
    return result


async def async_generator(agen: AsyncGenerator, tag: str, shim: Any,
                          finish: Finish) -> AsyncGenerator:
    try:
        value = None
        while True:
            try:
                item = await Steps(agen.asend(value), tag, shim)
            except StopAsyncIteration:
                break
            value = yield item
    except GeneratorExit:
        await Steps(agen.aclose(), tag, shim)
        finish(None)
        raise
    except BaseException as e:
        finish(e)
        raise
    finish(None)
