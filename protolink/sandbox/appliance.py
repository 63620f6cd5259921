"""The appliance: a DockerSandbox left running for ``protolink-sandbox``, and found again by its labels.

Blocking where it asks the engine (:func:`find`); call it through ``asyncio.to_thread`` from
async code, inside :func:`~protolink.sandbox.engine.engine_errors`.
"""

from __future__ import annotations

import socket
from typing import Any

from protolink.errors import SandboxError

from . import engine
from .docker import DockerSandbox, published_address

APPLIANCE_LABEL = "io.protolink.appliance"
ADDRESS_LABEL = "io.protolink.address"


class Appliance(DockerSandbox):
    """A DockerSandbox named ``name`` that never expires and carries the labels :func:`find` and
    :func:`address` read."""

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name=name, owner=f"appliance:{socket.gethostname()}", expiry_seconds=None, **options)

    def _labels(self) -> dict[str, str]:
        extra = {APPLIANCE_LABEL: self.name}
        if not self.tcp:
            extra[ADDRESS_LABEL] = f"unix://{self._host_dirs[0] / 'sandbox.sock'}"
        return {**super()._labels(), **extra}


def find(name: str) -> Any | None:
    """The container of appliance ``name`` (a docker SDK object), or None when it is not up."""
    import docker.errors

    client = engine.client()
    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    finally:
        client.close()
    return container if container.labels.get(APPLIANCE_LABEL) == name else None


def address(container: Any) -> str:
    """The address a client connects to: the socket label, or the published TCP port."""
    found = container.labels.get(ADDRESS_LABEL) or published_address(container)
    if found is None:
        raise SandboxError(f"appliance {container.name} publishes no address")
    return str(found)
