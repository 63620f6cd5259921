"""current_datetime: structured current time in UTC or an IANA timezone."""

from __future__ import annotations

import functools
import zoneinfo
from datetime import datetime, timezone, tzinfo
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from protolink.core.tools import Tool, ToolContext

MAX_TIMEZONE_CHARS = 100
# Keys in some zoneinfo directories that stand for the host's own clock, not an IANA zone.
_HOST_ALIASES = frozenset({"localtime", "posixrules"})
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "timezone": {"type": "string"},
        "iso": {"type": "string", "description": "ISO-8601 timestamp with UTC offset"},
        "date": {"type": "string"},
        "time": {"type": "string"},
        "weekday": {"type": "string"},
        "utc_offset": {"type": "string"},
        "unix_timestamp": {"type": "integer"},
    },
    "required": ["timezone", "iso", "date", "time", "weekday", "utc_offset", "unix_timestamp"],
    "additionalProperties": False,
}


class CurrentDatetimeArguments(BaseModel):
    """Arguments of ``current_datetime``."""

    model_config = ConfigDict(extra="forbid")

    timezone: str = Field("UTC", min_length=1, max_length=MAX_TIMEZONE_CHARS,
                          description="IANA timezone name such as 'Europe/Zurich'")


def current_datetime() -> Tool:
    """A fresh clock tool; needs no capability.

    UTC needs no timezone database; other IANA names use the system database or the ``tzdata``
    package. Returns ``timezone``, ``iso``, ``date``, ``time``, ``weekday``, ``utc_offset`` and
    ``unix_timestamp``. Empty, oversized, unknown or unavailable names raise ValueError; host
    local time is never substituted.
    """
    return Tool(
        name="current_datetime",
        description="Current date and time in UTC or an IANA timezone such as 'Europe/Zurich'.",
        arguments=CurrentDatetimeArguments,
        handler=_now,
        tags=("builtin", "time", "read-only"),
        output_schema=OUTPUT_SCHEMA,
        builtin="protolink.tools.builtins.clock:current_datetime",
    )


async def _now(args: CurrentDatetimeArguments, context: ToolContext) -> dict[str, Any]:
    now = datetime.now(_zone(args.timezone)).replace(microsecond=0)
    iso = now.isoformat()
    return {
        "timezone": args.timezone,
        "iso": iso,
        "date": now.date().isoformat(),
        "time": now.time().isoformat(),
        "weekday": _WEEKDAYS[now.weekday()],
        "utc_offset": iso[len("YYYY-MM-DDTHH:MM:SS"):],  # "+HH:MM", with ":SS" for historical offsets
        "unix_timestamp": int(now.timestamp()),
    }


def _zone(name: str) -> tzinfo:
    if name == "UTC":
        return timezone.utc
    if name not in _known_zones() or name in _HOST_ALIASES:
        raise ValueError(f"unknown or unavailable timezone {name!r}: use an IANA name such as 'Europe/Zurich'")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as error:
        raise ValueError(f"timezone {name!r} is unavailable: {error}") from None


@functools.cache
def _known_zones() -> frozenset[str]:
    """Every IANA key the system database and the tzdata package provide (scanned once)."""
    return frozenset(zoneinfo.available_timezones())
