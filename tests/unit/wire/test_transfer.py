"""The transfer messages both ways; a sandbox's summary is checked as untrusted data."""

from __future__ import annotations

import pytest

from protolink.execution.transfer import TransferLimits, TransferResult
from protolink.wire import transfer as wire
from protolink.wire._pb import transfer_pb2


def test_limits_and_summaries_round_trip() -> None:
    limits = TransferLimits(max_total_bytes=10, max_file_bytes=5, max_entries=3, max_path_chars=20, max_depth=2)
    assert wire.limits(wire.limits_message(limits)) == limits
    result = TransferResult("/ws/tree", "tar", files=2, directories=1, symlinks=0, bytes=9, skipped=("fifo",))
    assert wire.summary(wire.summary_message(result), path="/ws/tree", limits=limits) == result


@pytest.mark.parametrize("field", [
    {"path": "/ws/other"},
    {"files": 4},
    {"directories": -1},
    {"bytes": 11},
    {"skipped": ["x" * 21]},
    {"skipped": [""]},
    {"kind": 7},
])
def test_a_summary_out_of_bounds_is_refused(field: dict) -> None:
    limits = TransferLimits(max_total_bytes=10, max_entries=3, max_path_chars=20)
    message = transfer_pb2.TransferSummary(**{"path": "/ws/tree", "kind": transfer_pb2.TRANSFER_KIND_TAR, **field})
    with pytest.raises(ValueError):
        wire.summary(message, path="/ws/tree", limits=limits)


def test_limits_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        wire.limits(transfer_pb2.TransferLimits(max_total_bytes=1, max_file_bytes=1, max_path_chars=1, max_depth=1))
