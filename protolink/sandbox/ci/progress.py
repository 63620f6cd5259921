"""What a CI job shows while it runs, and the masking of the values passed in with ``--env``.

On a terminal one status line is redrawn in place: the phase, the command, the elapsed time and
the last line of output. Elsewhere (a CI log) plain lines say when each command starts and ends,
and the commands' output goes to standard output as it comes. Either way every value of a
variable passed in is replaced by ``***`` before it is shown or kept.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterable
from typing import Protocol, TextIO

MASK = "***"
#: Values shorter than this are not masked: they would hide ordinary text everywhere.
MIN_MASKED = 4
#: The longest part of a line held back while waiting for its end (then shown as it is).
MAX_PENDING_LINE = 64 * 1024


class Masker:
    """Replaces each secret value (the longest first) by :data:`MASK`."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = sorted({value for value in secrets if len(value) >= MIN_MASKED}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.secrets:
            text = text.replace(value, MASK)
        return text


class Progress(Protocol):
    def phase(self, name: str) -> None: ...
    def command(self, phase: str, text: str) -> None: ...
    def output(self, text: str) -> None: ...
    def ended(self, text: str) -> None: ...
    def close(self) -> None: ...


class Silent:
    """Shows nothing (the Python API's default)."""

    def phase(self, name: str) -> None: ...
    def command(self, phase: str, text: str) -> None: ...
    def output(self, text: str) -> None: ...
    def ended(self, text: str) -> None: ...
    def close(self) -> None: ...


class PlainLines:
    """Lines for a log: ``ci: ...`` on ``err``, the commands' output on ``out``, masked, whole
    lines at a time (a line longer than :data:`MAX_PENDING_LINE` is shown in pieces)."""

    def __init__(self, masker: Masker, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.masker = masker
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._pending = ""

    def _say(self, text: str) -> None:
        self._flush_output()
        print(f"ci: {text}", file=self.err, flush=True)

    def phase(self, name: str) -> None:
        self._say(f"phase {name}")

    def command(self, phase: str, text: str) -> None:
        self._say(f"{phase}: $ {self.masker(text)}")

    def output(self, text: str) -> None:
        self._pending += text
        complete, newline, rest = self._pending.rpartition("\n")
        if newline:
            self.out.write(self.masker(complete + newline))
            self._pending = rest
        if len(self._pending) > MAX_PENDING_LINE:
            self._flush_output()
        self.out.flush()

    def _flush_output(self) -> None:
        if self._pending:
            self.out.write(self.masker(self._pending) + "\n")
            self.out.flush()
            self._pending = ""

    def ended(self, text: str) -> None:
        self._say(text)

    def close(self) -> None:
        self._flush_output()


class StatusLine:
    """One line on a terminal, redrawn at most every 0.1 s: phase, command, elapsed, last output."""

    def __init__(self, masker: Masker, err: TextIO | None = None) -> None:
        self.masker = masker
        self.err = err or sys.stderr
        self._phase = "starting"
        self._command = "image, workspace, sandbox"
        self._last = ""
        self._started = time.monotonic()
        self._drawn = 0.0

    def phase(self, name: str) -> None:
        self._phase = name
        self._draw(force=True)

    def command(self, phase: str, text: str) -> None:
        self._command, self._last, self._started = self.masker(text), "", time.monotonic()
        self._draw(force=True)

    def output(self, text: str) -> None:
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            self._last = lines[-1]
        self._draw()

    def ended(self, text: str) -> None:
        self.err.write(f"\r\x1b[2K{self.masker(text)}\n")
        self.err.flush()

    def tick(self) -> None:
        """Redraw now (the elapsed time moves; output may have come since the last draw)."""
        self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._drawn < 0.1:
            return
        self._drawn = now
        width = shutil.get_terminal_size((100, 20)).columns
        line = f"[{self._phase} {now - self._started:5.1f}s] {self._command}"
        if self._last:
            line += f" | {self.masker(self._last)}"
        printable = "".join(char if char.isprintable() else " " for char in line)
        self.err.write(f"\r\x1b[2K{printable[:max(width - 1, 10)]}")
        self.err.flush()

    def close(self) -> None:
        self.err.write("\r\x1b[2K")
        self.err.flush()
