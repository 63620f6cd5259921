"""What ``protolink-sandbox up`` leaves on the host for its other verbs: records of appliances.

Two files per appliance in this user's runtime directory (which only its owner can open, see
:func:`~protolink.sandbox.hostdirs.runtime_dir`): ``NAME.json``, the record of its container
and address, so that ``exec`` reaches it without asking the Docker Engine; and ``NAME.token``,
the TCP mode's token. An appliance with egress also has its daemon's files there
(``NAME.egress.*``: :class:`~protolink.sandbox.egress.control.EgressFiles`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

from .hostdirs import runtime_dir, write_private

#: Docker's rule for container names; it also keeps a name inside the runtime directory.
NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")


class Record(NamedTuple):
    """A running appliance as ``up`` left it: its name, container and address, whether it has
    egress (an egress daemon), and in TCP mode its certificate's fingerprint, which clients pin.
    (A named tuple: ``exec`` reads it, and is timed; dataclasses would import inspect and ast.)"""

    name: str
    container_id: str
    address: str
    egress: bool = False
    fingerprint: str | None = None


def checked_name(name: str) -> str:
    """``name`` when Docker accepts it as a container name; ValueError otherwise."""
    if not NAME.fullmatch(name):
        raise ValueError(f"invalid appliance name {name!r}: letters, digits, '_', '.' and '-', a letter or digit first")
    return name


def token_path(name: str) -> Path:
    """Where the TCP mode's token of appliance ``name`` is kept."""
    return runtime_dir() / f"{checked_name(name)}.token"


def save(record: Record, token: str | None) -> None:
    """Keep ``record`` (and the TCP mode's ``token``) for the other verbs, readable by this user only."""
    if token is not None:
        write_private(token_path(record.name), token)
    write_private(_record_path(record.name), json.dumps(record._asdict()))


def load(name: str) -> Record | None:
    """The record of appliance ``name``; None when there is none, or it cannot be read."""
    try:
        fields = json.loads(_record_path(name).read_text())
        return Record(**fields) if isinstance(fields, dict) else None
    except (OSError, ValueError, TypeError):
        return None


def read_token(name: str) -> str | None:
    """The TCP mode's token of appliance ``name``; None for a Unix socket."""
    try:
        return token_path(name).read_text()
    except FileNotFoundError:
        return None


def forget(name: str) -> None:
    """Remove what ``up`` kept for appliance ``name``."""
    for path in (_record_path(name), token_path(name)):
        path.unlink(missing_ok=True)


def _record_path(name: str) -> Path:
    return runtime_dir() / f"{checked_name(name)}.json"
