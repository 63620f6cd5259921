"""The server's first worker waits for a quiet moment: no call running, none for a while."""

from __future__ import annotations

import asyncio

import pytest
from protolink_sandboxd.activity import Activity


async def test_quiet_waits_while_a_call_runs_and_returns_after_it():
    activity = Activity()
    with activity.call():
        quiet = asyncio.ensure_future(activity.quiet(0.01))
        await asyncio.sleep(0.1)
        assert not quiet.done()
    await asyncio.wait_for(quiet, 30)


async def test_a_call_that_starts_meanwhile_postpones_the_quiet_moment():
    for _ in range(100):  # a machine that stalled this test for the whole quiet time gets another go
        activity = Activity()
        quiet = asyncio.ensure_future(activity.quiet(0.05))
        await asyncio.sleep(0)
        if not quiet.done():
            break  # it waits for its quiet moment: the call below starts meanwhile
    else:
        pytest.fail("quiet() returned at once every time, with no quiet time passed")
    with activity.call():
        await asyncio.sleep(0.1)
        assert not quiet.done()
    await asyncio.wait_for(quiet, 30)
