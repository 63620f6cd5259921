"""Captured process output: one byte cap over stdout and stderr combined, UTF-8 with replacement.

Every backend (the host runner and the sandbox server) feeds raw pipe chunks through an
:class:`OutputCollector`, so the cap and the decoding rules exist once.
"""

from __future__ import annotations

import codecs
from typing import Literal

Channel = Literal["stdout", "stderr"]
CHANNELS: tuple[Channel, Channel] = ("stdout", "stderr")


class OutputCollector:
    """Keeps at most ``max_bytes`` of stdout and stderr together, in arrival order.

    Bytes beyond the cap are discarded (and ``truncated`` set) while the caller keeps
    reading the pipes, so a flood never grows memory. Each channel decodes incrementally as
    UTF-8 with replacement: a character split across chunks decodes whole; one cut by the
    cap, or left incomplete at the end, becomes U+FFFD. The text :meth:`feed` and
    :meth:`close` return is exactly what the result holds, so emitted events and the final
    result agree.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self.kept_bytes = 0
        self.truncated = False
        self._decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in CHANNELS}
        self._parts: dict[Channel, list[str]] = {name: [] for name in CHANNELS}

    def feed(self, channel: Channel, data: bytes) -> str:
        """Account for one chunk read from ``channel``; return the newly kept text."""
        room = self.max_bytes - self.kept_bytes
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        if not data:
            return ""
        self.kept_bytes += len(data)
        return self._keep(channel, self._decoders[channel].decode(data))

    def close(self) -> list[tuple[Channel, str]]:
        """Flush both decoders; return the final text of each channel that had some left."""
        tails = []
        for channel in CHANNELS:
            text = self._keep(channel, self._decoders[channel].decode(b"", final=True))
            if text:
                tails.append((channel, text))
        return tails

    @property
    def stdout(self) -> str:
        return "".join(self._parts["stdout"])

    @property
    def stderr(self) -> str:
        return "".join(self._parts["stderr"])

    def _keep(self, channel: Channel, text: str) -> str:
        if text:
            self._parts[channel].append(text)
        return text
