"""Where a sandbox service keeps its files: all in this user's runtime directory
(:func:`~protolink.sandbox.hostdirs.runtime_dir`), named after the service."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..hostdirs import MAX_SOCKET_PATH_BYTES, owner_only_dir, runtime_dir
from ..records import checked_name

#: The service ``up`` starts, named after the appliance.
DEFAULT_NAME = "protolink-appliance"


def commands_socket(service_socket: str) -> str:
    """Where the service at the Unix socket ``service_socket`` serves its command channel
    (:mod:`.command_relay`)."""
    return f"{service_socket}.commands"


@dataclass(frozen=True)
class ServiceFiles:
    """The files of service ``name``: its socket, tokens, default token, pid record, log, and the
    private directory that holds the managed workspaces."""

    name: str
    base: Path

    @classmethod
    def named(cls, name: str) -> ServiceFiles:
        """The files of service ``name`` in the runtime directory, for reading them (its audit
        log): ValueError when ``name`` is no container name."""
        return cls(checked_name(name), runtime_dir())

    @classmethod
    def of(cls, name: str) -> ServiceFiles:
        """:meth:`named`, also a ValueError when ``name`` is too long for its socket's path."""
        files = cls.named(name)
        longest = commands_socket(str(files.socket))
        if len(os.fsencode(longest)) > MAX_SOCKET_PATH_BYTES:
            raise ValueError(f"service name {name!r} is too long: its socket {longest} would pass the "
                             f"{MAX_SOCKET_PATH_BYTES} bytes of a Unix socket's path")
        return files

    def _file(self, suffix: str) -> Path:
        return self.base / f"{self.name}.service.{suffix}"

    @property
    def socket(self) -> Path:
        return self._file("sock")

    @property
    def address(self) -> str:
        return f"unix://{self.socket}"

    @property
    def tokens(self) -> Path:
        return self._file("tokens.json")

    @property
    def default_token(self) -> Path:
        return self._file("token")

    @property
    def renewals(self) -> Path:
        return self._file("renewals.json")

    @property
    def pid(self) -> Path:
        return self._file("pid")

    @property
    def log(self) -> Path:
        return self._file("log")

    @property
    def swarm(self) -> Path:
        """The Swarm manager a service placing on Swarm uses (JSON), for ``down`` to remove its
        Swarm services even when the service is gone."""
        return self._file("swarm.json")

    @property
    def audit(self) -> Path:
        """The audit log: every request, sandbox, command, file written and egress decision, chained."""
        return self._file("audit.jsonl")

    @property
    def tls(self) -> Path:
        """The directory of the TCP listener's certificate and key (made at the first TCP start)."""
        return self._file("tls")

    def workspaces(self) -> Path:
        """The 0700 directory of the managed workspaces, created when missing."""
        return owner_only_dir(self.base / f"{self.name}.workspaces", "PROTOLINK_RUNTIME_DIR",
                              "the service's workspace directory")
