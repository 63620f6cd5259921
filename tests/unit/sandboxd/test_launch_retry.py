"""A command refused a process for lack of tasks (EAGAIN, while a fork bomb's killed strays are
still being reaped) is tried again after a sweep; other refusals stand at once."""

from __future__ import annotations

import errno

import pytest
from protolink_sandboxd import execute
from protolink_sandboxd.execute import CommandLauncher

from protolink.execution.process_types import ProcessSpec

SPEC = ProcessSpec(("/bin/true",), "/", {}, 5, 1024)


class Refusing:
    """A launcher that refuses the first ``times`` launches with ``number``."""

    def __init__(self, times: int, number: int) -> None:
        self.times, self.number, self.launches = times, number, 0

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int, stdin: int | None = None) -> str:
        self.launches += 1
        if self.launches <= self.times:
            raise OSError(self.number, "refused")
        return "started"


class Sweeps:
    def __init__(self) -> None:
        self.count = 0

    async def sweep(self) -> int:
        self.count += 1
        return 0


@pytest.fixture(autouse=True)
def short_pauses(monkeypatch):
    monkeypatch.setattr(execute, "NO_TASK_RETRY_SECONDS", (0.001, 0.001, 0.001))


async def test_a_launch_refused_for_lack_of_tasks_is_tried_again_after_a_sweep():
    launcher, sweeps = Refusing(2, errno.EAGAIN), Sweeps()
    assert await CommandLauncher(launcher, sweeps).launch(SPEC, 1, 2) == "started"
    assert (launcher.launches, sweeps.count) == (3, 2)


async def test_the_refusal_stands_once_the_retries_are_spent():
    launcher, sweeps = Refusing(10, errno.EAGAIN), Sweeps()
    with pytest.raises(OSError) as refused:
        await CommandLauncher(launcher, sweeps).launch(SPEC, 1, 2)
    assert refused.value.errno == errno.EAGAIN and launcher.launches == 4


async def test_other_refusals_are_not_retried():
    launcher, sweeps = Refusing(1, errno.ENOENT), Sweeps()
    with pytest.raises(OSError):
        await CommandLauncher(launcher, sweeps).launch(SPEC, 1, 2)
    assert (launcher.launches, sweeps.count) == (1, 0)
