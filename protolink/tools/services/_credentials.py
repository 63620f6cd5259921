"""Secrets given as a value or as a no-argument sync/async callback, resolved per operation."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Union

SecretSource = Union[str, Callable[[], Union[str, Awaitable[str]]]]


def check_secret_source(source: SecretSource, what: str) -> SecretSource:
    """The source itself; TypeError unless it is a string or a no-argument callable."""
    if not isinstance(source, str) and not callable(source):
        raise TypeError(f"{what} must be a string or a no-argument callable returning one")
    return source


async def resolve_secret(source: SecretSource, what: str) -> str:
    """The current secret: the string itself, or the callback's (awaited) answer.

    Error messages name ``what`` but never include the secret.
    """
    value = source() if callable(source) else source
    if inspect.isawaitable(value):
        value = await value
    if not isinstance(value, str) or not value:
        raise ValueError(f"the {what} must be a non-empty string")
    return value
