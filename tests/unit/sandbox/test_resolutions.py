"""Resolutions a sandbox client reuses: by command as written, rechecked when their command starts."""

from __future__ import annotations

from protolink.execution.process_types import ProcessSpec
from protolink.execution.resolve import Resolved
from protolink.sandbox.resolutions import Resolutions

ENV = {"PATH": "/usr/bin:/bin"}


def spec(executable: str, cwd: str, env: dict[str, str] = ENV) -> ProcessSpec:
    return ProcessSpec((executable, "-x"), cwd, env, 10.0, 1024)


def answer(executable: str, cwd: str) -> Resolved:
    return Resolved((executable,), cwd, executable + ".real")


def test_a_fresh_answer_is_reused_for_the_same_name_directory_and_path():
    kept = Resolutions()
    kept.remember("git", "/w", ENV, answer("/usr/bin/git", "/real/w"))
    assert kept.reuse("git", "/w", {**ENV, "HOME": "/h"}) == answer("/usr/bin/git", "/real/w")
    assert kept.reuse("git", "/w", {"PATH": "/bin"}) is None
    assert kept.reuse("git", "/other", ENV) is None
    assert kept.reuse("./git", "/w", ENV) is None


def test_only_a_reused_answer_asks_for_a_check_when_its_command_starts():
    kept = Resolutions()
    kept.remember("git", "/w", ENV, answer("/usr/bin/git", "/real/w"))
    assert kept.written(spec("/usr/bin/git", "/real/w")) is None  # fresh: resolved just now
    kept.reuse("git", "/w", ENV)
    assert kept.written(spec("/usr/bin/git", "/real/w")) == ("git", "/w")
    assert kept.written(spec("/usr/bin/git", "/real/w", {"PATH": "/bin"})) is None


def test_a_forgotten_answer_is_asked_for_again():
    kept = Resolutions()
    kept.remember("git", "/w", ENV, answer("/usr/bin/git", "/real/w"))
    kept.reuse("git", "/w", ENV)
    kept.forget(spec("/usr/bin/git", "/real/w"))
    assert kept.reuse("git", "/w", ENV) is None
    assert kept.written(spec("/usr/bin/git", "/real/w")) is None


def test_the_oldest_answers_go_first_when_the_bound_is_reached():
    kept = Resolutions(size=2)
    for name in ("a", "b"):
        kept.remember(name, "/w", ENV, answer(f"/bin/{name}", "/w"))
    kept.reuse("a", "/w", ENV)  # "a" is now the most recently used
    kept.remember("c", "/w", ENV, answer("/bin/c", "/w"))
    assert kept.reuse("b", "/w", ENV) is None
    assert kept.reuse("a", "/w", ENV) == answer("/bin/a", "/w")
    assert kept.reuse("c", "/w", ENV) == answer("/bin/c", "/w")
