"""Every built-in tool factory, plus the calendar and email service backends.

Names load lazily, so importing this package pulls in no optional dependency.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import builtins as _builtins

_SERVICES: dict[str, str] = {
    "GoogleCalendar": "google",
    "Gmail": "google",
    "GoogleAPIError": "google",
    "OutlookCalendar": "microsoft",
    "OutlookEmail": "microsoft",
    "MicrosoftGraphError": "microsoft",
    "IMAPEmail": "imap",
    "MailBackendError": "imap",
    "InMemoryCalendar": "memory",
    "InMemoryEmail": "memory",
}

__all__ = sorted([*_builtins.__all__, *_SERVICES])


def __getattr__(name: str) -> Any:
    if name in _SERVICES:
        value = getattr(importlib.import_module(f"{__name__}.services.{_SERVICES[name]}"), name)
    elif name in _builtins.__all__:
        value = getattr(_builtins, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
