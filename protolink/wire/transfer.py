"""Conversions between the transfer messages and :mod:`protolink.execution.transfer`'s types.

Decoding raises ValueError, as :mod:`.convert` does: the server answers a malformed request with
``INVALID_ARGUMENT``, the host reports a malformed answer as a protocol fault. Not built on
:mod:`.convert`, whose imports would double the start of every transfer process.
"""

from __future__ import annotations

from dataclasses import fields

from protolink.execution.transfer import Kind, TransferLimits, TransferResult

from ._pb import transfer_pb2 as transfer

KINDS: dict[int, Kind] = {transfer.TRANSFER_KIND_FILE: "file", transfer.TRANSFER_KIND_TAR: "tar"}
KIND_NUMBERS = {name: number for number, name in KINDS.items()}


def kind(number: int) -> Kind:
    if number not in KINDS:
        raise ValueError(f"unknown transfer kind {number}")
    return KINDS[number]


def limits_message(limits: TransferLimits) -> transfer.TransferLimits:
    return transfer.TransferLimits(**{field.name: getattr(limits, field.name) for field in fields(limits)})


def limits(message: transfer.TransferLimits) -> TransferLimits:
    """The limits a request carries (ValueError for a bound below 1)."""
    return TransferLimits(**{field.name: getattr(message, field.name) for field in fields(TransferLimits)})


def summary_message(result: TransferResult) -> transfer.TransferSummary:
    return transfer.TransferSummary(path=result.path, kind=KIND_NUMBERS[result.kind], files=result.files,
                                    directories=result.directories, symlinks=result.symlinks, bytes=result.bytes,
                                    skipped=result.skipped)


def summary(message: transfer.TransferSummary, *, path: str, limits: TransferLimits) -> TransferResult:
    """What the sandbox says it moved at ``path``, checked against what was asked and ``limits``."""
    counts = (message.files, message.directories, message.symlinks, len(message.skipped))
    for valid, problem in (
        (message.path == path, "a transfer of another path"),
        (all(0 <= count <= limits.max_entries for count in counts), "an invalid count"),
        (0 <= message.bytes <= limits.max_total_bytes, "an invalid size"),
        (all(0 < len(name) <= limits.max_path_chars for name in message.skipped), "an invalid skipped path"),
    ):
        if not valid:
            raise ValueError(f"the sandbox reported {problem}")
    return TransferResult(message.path, kind(message.kind), files=message.files, directories=message.directories,
                          symlinks=message.symlinks, bytes=message.bytes, skipped=tuple(message.skipped))
