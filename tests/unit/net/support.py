"""What the tests of joined connections look at from outside."""

from __future__ import annotations

from tests.descriptors import descriptor_targets


def pipe_ends() -> int:
    """Pipe ends this process holds open (a spliced join holds one pipe a direction)."""
    return sum(target.startswith("pipe:") for target in descriptor_targets().values())
