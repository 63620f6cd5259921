"""Tokens: who may call the service, and how much each may hold at once.

The tokens file (JSON, mode 0600) keeps, per token, its name, the SHA-256 digest of the token
(never the token) and its quota. A token is its tenant: it sees and touches only the sandboxes
it created. A tenant's ``id`` is the start of its digest; that is what a sandbox's container
records of its owner.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from ..hostdirs import write_private

DIGEST_ID_CHARS = 16


@dataclass(frozen=True)
class Quota:
    """The most a token may hold at once: ``sandboxes``, ``memory_bytes`` and ``cpus`` in all its
    running sandboxes (None: no bound)."""

    sandboxes: int | None = None
    memory_bytes: int | None = None
    cpus: float | None = None

    def refusal(self, sandboxes: int, memory_bytes: int, cpus: float) -> str | None:
        """Why holding this much would exceed the quota; None when it would not."""
        if self.sandboxes is not None and sandboxes > self.sandboxes:
            return f"at most {self.sandboxes} sandboxes at once"
        if self.memory_bytes is not None and memory_bytes > self.memory_bytes:
            return f"at most {self.memory_bytes >> 20} MiB of memory in all sandboxes"
        if self.cpus is not None and cpus > self.cpus + 1e-9:
            return f"at most {self.cpus:g} CPUs in all sandboxes"
        return None


@dataclass(frozen=True)
class Tenant:
    """A token as the service knows it: its ``id`` (from its digest), ``name`` and ``quota``."""

    id: str
    name: str
    quota: Quota


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Tokens:
    """The tokens file at ``path``; read again whenever it changes on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._by_digest: dict[str, Tenant] = {}

    def tenant(self, token: str) -> Tenant | None:
        """The tenant of ``token``; None when the file does not know it."""
        wanted = digest(token)
        for known, tenant in self._load().items():
            if hmac.compare_digest(known, wanted):
                return tenant
        return None

    def add(self, name: str, quota: Quota = Quota()) -> str:
        """A new token named ``name`` with ``quota``: its digest is written, the token returned
        (the only time it is seen). ValueError for a name that is taken or empty."""
        if not name or not name.isprintable():
            raise ValueError(f"a token needs a printable name, got {name!r}")
        entries = self._entries()
        if any(entry["name"] == name for entry in entries):
            raise ValueError(f"a token named {name!r} exists already")
        token = secrets.token_urlsafe(32)
        entries.append({"name": name, "sha256": digest(token), **asdict(quota)})
        write_private(self.path, json.dumps({"tokens": entries}, indent=1))
        return token

    def _entries(self) -> list[dict[str, object]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list):
            raise ValueError(f"{self.path} is not a tokens file")
        return tokens

    def _load(self) -> dict[str, Tenant]:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return {}
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp != self._stamp:
            self._by_digest = {
                str(entry["sha256"]): Tenant(str(entry["sha256"])[:DIGEST_ID_CHARS], str(entry["name"]),
                                             Quota(entry.get("sandboxes"), entry.get("memory_bytes"),  # type: ignore[arg-type]
                                                   entry.get("cpus")))  # type: ignore[arg-type]
                for entry in self._entries()
            }
            self._stamp = stamp
        return self._by_digest


def ensure_default(tokens: Tokens, token_file: Path, name: str = "local") -> str:
    """The local default token: the one in ``token_file`` (0600) when the tokens file knows it,
    else a new one written there."""
    try:
        token = token_file.read_text().strip()
        if tokens.tenant(token) is not None:
            return token
    except FileNotFoundError:
        pass
    token = tokens.add(f"{name}-{secrets.token_hex(3)}")
    write_private(token_file, token)
    return token
