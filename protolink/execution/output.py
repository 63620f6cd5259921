"""Captured process output: one byte cap over stdout and stderr combined, UTF-8 with replacement.

Where the pipes are read, an :class:`OutputCap` keeps the first ``max_output_bytes`` bytes of
both channels together and drops the rest as it arrives. An :class:`OutputCollector` decodes
what was kept, keeps the text for the result and emits it as ``process.output`` events. On the
host both happen in one process; in a sandbox the server caps the bytes and streams them, and
the client collects them, capping them again because the server is untrusted. So the rules
exist once, and every backend makes the same text of the same bytes.
"""

from __future__ import annotations

import codecs
import sys
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

if TYPE_CHECKING:  # `protolink-sandbox exec` takes OutputCap from here, and imports no asyncio
    from .process_types import Emitter

Channel = Literal["stdout", "stderr"]
Data = TypeVar("Data", bytes, memoryview)
CHANNELS: tuple[Channel, Channel] = ("stdout", "stderr")
#: While a tracer or profiler runs, kept text waits until it adds up to this share of the text
#: kept before it (as a shift: 1/8) or to :data:`MIN_BATCH_CHARACTERS`, whichever is more.
BATCH_SHARE_SHIFT = 3
MIN_BATCH_CHARACTERS = 1 << 20


class OutputCap:
    """The first ``max_bytes`` bytes of stdout and stderr together, in arrival order.

    Bytes beyond the cap are dropped (and ``truncated`` set) while the caller keeps reading, so
    a flood never grows memory.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.kept_bytes = 0
        self.truncated = False

    def take(self, data: Data) -> Data:
        """The part of ``data`` (the next chunk of either channel) that is kept."""
        room = self.max_bytes - self.kept_bytes
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        self.kept_bytes += len(data)
        return data


class OutputSink(Protocol):
    """Where a process's kept output goes, in order: an :class:`OutputCollector` on the host; the
    sandbox server streams it to its client instead, and keeps none."""

    async def feed(self, channel: Channel, data: bytes | memoryview) -> None:
        """The next kept bytes of ``channel``; the next piece waits until this returns. A view
        is valid only until then: its buffer is read into again (keep a copy, not the view)."""

    async def finish(self) -> None:
        """Everything has been fed (the process ended)."""

    def close(self) -> object:
        """The process was canceled: nothing more comes, and nothing more is emitted."""

    @property
    def stdout(self) -> str:
        """The text the result holds for stdout."""

    @property
    def stderr(self) -> str:
        """The text the result holds for stderr."""


class OutputCollector:
    """Kept output decoded into the result's text and emitted to ``execution`` as it arrives.

    Each channel decodes incrementally as UTF-8 with replacement: a character split across
    chunks decodes whole; one cut by the cap, or left incomplete at the end, becomes U+FFFD.
    Every piece of text the result holds is emitted once, in order, as a ``process.output``
    event, so events and result agree.
    """

    def __init__(self, execution: Emitter) -> None:
        self._execution = execution
        self._kept: dict[Channel, KeptText] = {name: KeptText() for name in CHANNELS}
        #: Per channel that has had bytes: the start of a character its last bytes cut.
        self._tails: dict[Channel, bytes] = {}
        self._closed = False

    async def feed(self, channel: Channel, data: bytes | memoryview) -> None:
        """Decode, keep and emit the next kept bytes of ``channel`` (a view is decoded where it lies)."""
        await self._emit(channel, self._keep(channel, self._decode(channel, data)))

    async def finish(self) -> None:
        """The output is complete: keep and emit what the decoders still hold."""
        for channel, text in self.close():
            await self._emit(channel, text)

    def close(self) -> list[tuple[Channel, str]]:
        """Keep what the decoders still hold (once) and return it, not emitted: a canceled
        process's partial result ends with it."""
        if self._closed:
            return []
        self._closed = True
        tails = [(channel, self._keep(channel, self._decode(channel, b"", final=True))) for channel in list(self._tails)]
        return [(channel, text) for channel, text in tails if text]

    @property
    def stdout(self) -> str:
        return self._kept["stdout"].text

    @property
    def stderr(self) -> str:
        return self._kept["stderr"].text

    def _decode(self, channel: Channel, data: bytes | memoryview, *, final: bool = False) -> str:
        # codecs' incremental decoder would copy a view into bytes first; this decodes it in place
        # and keeps only the cut character's bytes (at most three) for the next piece.
        if tail := self._tails.get(channel):
            data = tail + data
        text, used = codecs.utf_8_decode(data, "replace", final)
        self._tails[channel] = bytes(data[used:])
        return text

    def _keep(self, channel: Channel, text: str) -> str:
        self._kept[channel].append(text)
        return text

    async def _emit(self, channel: Channel, text: str) -> None:
        if text:
            await self._execution.emit("process.output", channel=channel, text=text)


class KeptText:
    """One channel's kept text, appended to in time linear in its length.

    It is one string, appended to while nothing else refers to it: CPython then grows it in
    place (realloc), so the result costs its size once, where a join of the pieces would hold
    it twice at the end. Python 3.11 does that only while no tracer or profiler runs (coverage,
    a debugger); otherwise each append copies the whole text, and appending every piece would
    take time quadratic in the output's size. So while one runs, pieces wait until they add up
    to a share of the text (:data:`BATCH_SHARE_SHIFT`) and are appended as one: each character
    is copied at most about 8 times.
    """

    def __init__(self) -> None:
        self._text = ""
        self._waiting: list[str] = []
        self._waiting_length = 0

    @property
    def text(self) -> str:
        """Everything appended so far."""
        self._append_waiting()
        return self._text

    def append(self, text: str) -> None:
        """Append ``text``."""
        if not self._waiting and sys.gettrace() is None and sys.getprofile() is None:
            self._append(text)
            return
        self._waiting.append(text)
        self._waiting_length += len(text)
        if self._waiting_length >= max(len(self._text) >> BATCH_SHARE_SHIFT, MIN_BATCH_CHARACTERS):
            self._append_waiting()

    def _append_waiting(self) -> None:
        if self._waiting:
            self._append(self._waiting[0] if len(self._waiting) == 1 else "".join(self._waiting))
            self._waiting.clear()
            self._waiting_length = 0

    def _append(self, text: str) -> None:
        kept, self._text = self._text, ""
        kept += text
        self._text = kept
