"""current_datetime(): structured current time; UTC needs no timezone database, unknown zones fail."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from protolink.tools import current_datetime

FIELDS = {"timezone", "iso", "date", "time", "weekday", "utc_offset", "unix_timestamp"}


async def test_utc_fields_are_consistent_and_current():
    before = int(time.time())
    now = await current_datetime()()
    after = int(time.time())

    assert set(now) == FIELDS
    assert now["timezone"] == "UTC" and now["utc_offset"] == "+00:00"
    assert before <= now["unix_timestamp"] <= after
    parsed = datetime.fromisoformat(now["iso"])
    assert int(parsed.timestamp()) == now["unix_timestamp"]
    assert now["iso"] == f"{now['date']}T{now['time']}{now['utc_offset']}"
    assert now["weekday"] == parsed.strftime("%A") and now["weekday"] in (
        "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


@pytest.mark.parametrize("zone", ["Europe/Zurich", "Asia/Kolkata", "America/St_Johns", "Pacific/Chatham"])
async def test_iana_zones_use_their_own_offset(zone):
    now = await current_datetime()(timezone=zone)

    expected = datetime.fromtimestamp(now["unix_timestamp"], ZoneInfo(zone))
    assert now["timezone"] == zone
    assert now["iso"] == expected.isoformat()
    assert now["utc_offset"] == expected.isoformat()[19:]
    assert datetime.fromisoformat(now["iso"]).utcoffset() == expected.utcoffset() != timedelta(0)


@pytest.mark.parametrize("zone", ["", "x" * 101, "Mars/Olympus_Mons", "utc", "localtime", "../../etc/passwd",
                                  "/etc/localtime", "Europe/", "posix/Europe/Zurich"])
async def test_empty_oversized_unknown_or_host_local_zones_are_value_errors(zone):
    with pytest.raises(ValueError, match="timezone"):
        await current_datetime()(timezone=zone)


_PROBE = """
import sys
if sys.argv[1] == "hide-tzdata":
    sys.modules["tzdata"] = None  # as if the package were not installed
import asyncio, json
from protolink.tools import current_datetime
tool = current_datetime()
outcome = {}
for zone in ("UTC", "Europe/Zurich"):
    try:
        outcome[zone] = asyncio.run(tool(timezone=zone))["timezone"]
    except ValueError as error:
        outcome[zone] = "ValueError"
print(json.dumps(outcome))
"""


@pytest.mark.parametrize(
    ("tzdata", "expected"),
    [("hide-tzdata", {"UTC": "UTC", "Europe/Zurich": "ValueError"}),
     ("keep-tzdata", {"UTC": "UTC", "Europe/Zurich": "Europe/Zurich"})],
)
async def test_without_a_system_timezone_database(tmp_path: Path, tzdata, expected):
    """UTC needs no database; other zones fall back to the tzdata package, or fail clearly."""
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, tzdata],
        env={"PYTHONTZPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "TZ": "Asia/Tokyo"},
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert json.loads(run.stdout) == expected


async def test_the_tool_needs_no_capability_and_serializes_by_identity():
    tool = current_datetime()

    assert tool.name == "current_datetime" and tool.capabilities == ()
    assert tool.builtin == "protolink.tools.builtins.clock:current_datetime"
    assert tool.input_schema["properties"]["timezone"]["maxLength"] == 100
