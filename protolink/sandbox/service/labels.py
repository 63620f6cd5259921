"""What a service's sandbox container records about itself, so that a restarted service adopts it.

The labels hold the service's name, when the sandbox was asked for (its time to live counts
from then), the template, the limits, the time to live and idle timeout
(seconds), the egress rules, the managed workspace and the client's own labels. The owner
(a tenant id, never a token) is in the container's name, ``SERVICE.TENANT.ID``: a pooled
sandbox is started as ``SERVICE.pool.ID`` and renamed when a tenant claims it, and a
container still named so when the service starts is a pool leftover, removed. A Swarm service
records its owner and id in labels (:data:`TENANT`, :data:`SANDBOX`): its name is
``SERVICE-TENANT-ID`` (:func:`swarm_name`), since Swarm takes no dots there, and a service
cannot be renamed, so a pooled one keeps ``SERVICE-pool-ID`` and an empty :data:`TENANT` until a
claim writes its owner (and :data:`CREATED`) into its labels; one whose :data:`TENANT` is still
empty when the service starts is a pool leftover, removed.
"""

from __future__ import annotations

import json

SERVICE = "io.protolink.service"
TEMPLATE = "io.protolink.service.template"
CREATED = "io.protolink.service.created"
LIMITS = "io.protolink.service.limits"
TTL = "io.protolink.service.ttl"
IDLE = "io.protolink.service.idle"
EGRESS = "io.protolink.service.egress"
WORKSPACE = "io.protolink.service.workspace"
POOLED = "io.protolink.service.pooled"
TENANT = "io.protolink.service.tenant"
SANDBOX = "io.protolink.service.sandbox"
USER_PREFIX = "io.protolink.label."
POOL_OWNER = "pool"


def container_name(service: str, tenant: str, sandbox_id: str) -> str:
    return f"{service}.{tenant or POOL_OWNER}.{sandbox_id}"


def swarm_name(service: str, tenant: str, sandbox_id: str) -> str:
    return f"{service}-{tenant or POOL_OWNER}-{sandbox_id}"


def owner_of(name: str, service: str) -> tuple[str, str] | None:
    """The tenant id (``pool`` for an unclaimed one) and sandbox id a container name holds; None
    when it is not one of ``service``'s."""
    prefix = f"{service}."
    if not name.startswith(prefix) or name[len(prefix):].count(".") != 1:
        return None
    tenant, sandbox_id = name[len(prefix):].split(".")
    return tenant, sandbox_id


def seconds(value: float | None) -> str:
    return "0" if value is None else repr(float(value))


def seconds_from(text: str | None) -> float | None:
    try:
        value = float(text or 0)
    except ValueError:
        return None
    return value if value > 0 else None


def rules(allow: tuple[str, ...] | None) -> str | None:
    return None if allow is None else json.dumps(list(allow))


def rules_from(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(map(str, json.loads(text)))
