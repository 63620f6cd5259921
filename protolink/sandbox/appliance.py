"""The appliance: a DockerSandbox left running for ``protolink-sandbox``, and found again by its labels.

Blocking where it asks the engine (:func:`find`); call it through ``asyncio.to_thread`` from
async code, inside :func:`~protolink.sandbox.engine.engine_errors`.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Any

from protolink.errors import SandboxError

from . import engine
from .config import NoNetwork, SandboxConfig
from .docker import DockerSandbox, published_address
from .placements.docker import ContainerSpec, EngineFacts, HostFacts, unix_address

APPLIANCE_LABEL = "io.protolink.appliance"
ADDRESS_LABEL = "io.protolink.address"


def appliance_config(name: str, **options: Any) -> SandboxConfig:
    """The configuration of appliance ``name`` (the other keywords are those of
    :meth:`SandboxConfig.from_options`): it never expires, and its owner is this host."""
    return SandboxConfig.from_options(name=name, owner=f"appliance:{socket.gethostname()}", expiry_seconds=None,
                                      **options)


class Appliance(DockerSandbox):
    """A DockerSandbox (of an :func:`appliance_config`) whose container carries the labels
    :func:`find` and :func:`address` read."""

    def _spec(self, engine_facts: EngineFacts, host: HostFacts) -> ContainerSpec:
        spec = super()._spec(engine_facts, host)
        extra = {APPLIANCE_LABEL: self.name}
        if isinstance(self.config.network, NoNetwork):
            extra[ADDRESS_LABEL] = unix_address(host.channel_dir)
        return replace(spec, labels={**spec.labels, **extra})


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
