"""Command resolutions a sandbox client reuses instead of asking the sandbox again.

Resolving a command (:meth:`SandboxBackend.resolve_command`) costs a round trip before
approval, and agents run the same few executables over and over. An answer is therefore kept
for the command as written: its ``argv[0]``, its working directory and the ``PATH`` it is
looked up in (the only inputs of the rules in :mod:`protolink.execution.resolve`). A kept
answer may have gone stale, so when a command whose preview came from one starts, the request
carries the command as written (``ExecuteRequest.resolved_from``): the server resolves it again
and refuses to start anything but the approved executable in the approved directory.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Generic, TypeVar

from protolink.execution.process_types import ProcessSpec
from protolink.execution.resolve import Resolved

#: Answers (and reused answers awaiting their start) kept per client, the oldest dropped first.
KEPT_RESOLUTIONS = 256

Key = tuple[str, str, str | None]
K = TypeVar("K")
V = TypeVar("V")


class _Bounded(Generic[K, V]):
    """A mapping that keeps the ``size`` most recently stored or read entries."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)


class Resolutions:
    """Resolved answers by command as written; see the module."""

    def __init__(self, size: int = KEPT_RESOLUTIONS) -> None:
        self._answers: _Bounded[Key, Resolved] = _Bounded(size)
        self._reused: _Bounded[Key, tuple[str, str]] = _Bounded(size)

    def remember(self, executable: str, cwd: str, env: Mapping[str, str], resolved: Resolved) -> None:
        """Keep a fresh answer of the sandbox for ``executable`` run in ``cwd`` with ``env``."""
        self._answers.put((executable, cwd, env.get("PATH")), resolved)

    def reuse(self, executable: str, cwd: str, env: Mapping[str, str]) -> Resolved | None:
        """The kept answer, if any; the command it starts will be resolved again (:meth:`written`)."""
        path = env.get("PATH")
        answer = self._answers.get((executable, cwd, path))
        if answer is not None:
            self._reused.put((answer.argv[0], answer.cwd, path), (executable, cwd))
        return answer

    def written(self, spec: ProcessSpec) -> tuple[str, str] | None:
        """How the command of ``spec`` was written, when its resolution was a reused answer."""
        return self._reused.get((spec.argv[0], spec.cwd, spec.env.get("PATH")))

    def forget(self, spec: ProcessSpec) -> None:
        """Drop the answer behind ``spec``: it failed to start, so the next call resolves afresh."""
        path = spec.env.get("PATH")
        written = self._reused.pop((spec.argv[0], spec.cwd, path))
        if written is not None:
            self._answers.pop((*written, path))
