"""Every built-in tool factory, plus the calendar and email service backends.

Names load lazily, so importing this package pulls in no optional dependency.
"""

from __future__ import annotations

from protolink._lazy import lazy_exports

from . import builtins as _builtins

_SERVICES: dict[str, str] = {
    "GoogleCalendar": ".services.google",
    "Gmail": ".services.google",
    "GoogleAPIError": ".services.google",
    "OutlookCalendar": ".services.microsoft",
    "OutlookEmail": ".services.microsoft",
    "MicrosoftGraphError": ".services.microsoft",
    "IMAPEmail": ".services.imap",
    "MailBackendError": ".services.imap",
    "InMemoryCalendar": ".services.memory",
    "InMemoryEmail": ".services.memory",
}

_EXPORTS = {**dict.fromkeys(_builtins.__all__, ".builtins"), **_SERVICES}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
