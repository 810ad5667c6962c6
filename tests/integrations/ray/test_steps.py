"""Tag handling for tasks that run in pieces: generators and async actor coroutines."""

from __future__ import annotations

import asyncio

import pytest
from roar_ray import _steps


class FakeShim:
    """Records which tag is set while the task's code runs."""

    def __init__(self):
        self.tag: str | None = None
        self.log: list[tuple[str, str | None]] = []

    def begin(self, tag: str) -> None:
        assert self.tag is None, "tags never nest on the event loop thread"
        self.tag = tag

    def end(self) -> None:
        self.tag = None

    def process_tag(self, tag):  # pragma: no cover - not used here
        pass

    def note(self, what: str) -> None:
        self.log.append((what, self.tag))


def test_generator_forwards_send_and_finishes_once():
    got, finished = [], []

    def gen():
        x = yield 1
        got.append(x)
        y = yield 2
        got.append(y)
        return "done"

    g = _steps.generator(gen(), finished.append)
    assert next(g) == 1
    assert g.send("a") == 2
    with pytest.raises(StopIteration) as stop:
        g.send("b")
    assert stop.value.value == "done" and got == ["a", "b"] and finished == [None]


def test_generator_failure_and_early_close():
    finished = []

    def boom():
        yield 1
        raise ValueError("bad")

    g = _steps.generator(boom(), finished.append)
    next(g)
    with pytest.raises(ValueError):
        next(g)
    assert isinstance(finished[0], ValueError)
    finished.clear()
    g = _steps.generator(iter_forever(), finished.append)
    next(g)
    g.close()  # the consumer stopped early: the task still completed
    assert finished == [None]


def iter_forever():
    while True:
        yield 0


def test_interleaved_coroutines_each_see_only_their_own_tag():
    shim = FakeShim()
    finished = []

    async def call(name: str, delay: float):
        shim.note(f"{name} start")
        await asyncio.sleep(delay)
        shim.note(f"{name} middle")
        await asyncio.sleep(delay)
        shim.note(f"{name} end")
        return name

    async def main():
        tasks = [_steps.coroutine(call(n, d), n, shim, finished.append)
                 for n, d in (("a", 0.02), ("b", 0.01), ("c", 0.015))]
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == ["a", "b", "c"]
    assert len(shim.log) == 9
    assert all(what.split()[0] == tag for what, tag in shim.log), shim.log
    assert shim.tag is None and finished == [None] * 3


def test_coroutine_cancellation_reaches_the_task():
    shim = FakeShim()
    finished, cleaned = [], []

    async def slow():
        try:
            await asyncio.sleep(10)
        finally:
            shim.note("cleanup")
            cleaned.append(True)

    async def main():
        t = asyncio.ensure_future(_steps.coroutine(slow(), "t", shim, finished.append))
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())
    assert cleaned and shim.log == [("cleanup", "t")]
    assert isinstance(finished[0], asyncio.CancelledError) and shim.tag is None


def test_async_generator_steps_and_asend():
    shim = FakeShim()
    finished = []

    async def agen():
        shim.note("first")
        got = yield 1
        await asyncio.sleep(0)
        shim.note(f"got {got}")
        yield 2

    async def main():
        g = _steps.async_generator(agen(), "g", shim, finished.append)
        assert await g.asend(None) == 1
        assert shim.tag is None  # between items the loop runs other code
        assert await g.asend("x") == 2
        with pytest.raises(StopAsyncIteration):
            await g.asend(None)

    asyncio.run(main())
    assert shim.log == [("first", "g"), ("got x", "g")] and finished == [None]
