"""Which Swarm nodes may host a sandbox, from a manager's node listing: the CPUs its limits are
computed against are those of the nodes its constraints allow, never of the others."""

from __future__ import annotations

from typing import Any

from protolink.sandbox.config import Limits, SandboxConfig
from protolink.sandbox.placements.swarm import RUNTIME_LABEL, hosting_cpus
from protolink.sandbox.service.swarm import placement_spec


def node(cpus: int, labels: dict[str, str] | None = None, *, state: str = "ready",
         availability: str = "active") -> dict[str, Any]:
    """One entry of ``GET /nodes`` (the fields the placement reads)."""
    return {"Spec": {"Labels": labels or {}, "Availability": availability},
            "Status": {"State": state}, "Description": {"Resources": {"NanoCPUs": cpus * 10**9}}}


SMALL, BIG = node(2), node(8, {"size": "big"})


def test_only_the_nodes_with_the_templates_node_labels_count():
    config = SandboxConfig(roots=())
    assert hosting_cpus([SMALL, BIG], config, {"size": "big"}) == 8
    assert hosting_cpus([SMALL, BIG], config, {}) == 2


def test_a_configured_runtime_counts_only_the_nodes_carrying_its_label():
    gvisor = node(4, {RUNTIME_LABEL: "runsc", "size": "big"})
    config = SandboxConfig(roots=(), runtime="runsc")
    assert hosting_cpus([SMALL, BIG, gvisor], config, {}) == 4
    assert hosting_cpus([SMALL, BIG, gvisor], config, {"size": "big"}) == 4
    assert hosting_cpus([SMALL, BIG, gvisor], config, {"size": "small"}) is None


def test_a_sandbox_without_a_runtime_never_counts_gvisor_nodes():
    gvisor = node(1, {RUNTIME_LABEL: "runsc", "size": "big"})
    config = SandboxConfig(roots=())
    assert hosting_cpus([BIG, gvisor], config, {}) == 8
    assert hosting_cpus([BIG, gvisor], config, {"size": "big"}) == 8
    assert hosting_cpus([gvisor], config, {}) is None  # only a gVisor node is ready: none may run it
    assert hosting_cpus([node(2, {RUNTIME_LABEL: "runc"})], config, {}) == 2  # another runtime's label is no bar


def test_nodes_that_are_down_or_take_no_tasks_do_not_count():
    config = SandboxConfig(roots=())
    assert hosting_cpus([node(1, state="down"), node(1, availability="drain"), node(1, availability="pause"),
                         BIG], config, {}) == 8
    assert hosting_cpus([node(1, state="down")], config, {}) is None


def test_a_sandbox_asking_for_a_big_nodes_cpus_is_held_to_them_when_small_nodes_are_excluded():
    config = SandboxConfig(roots=(), limits=Limits(cpus=4), name="protolink-sandbox-big")
    cpus = hosting_cpus([SMALL, BIG], config, {"size": "big"})
    assert cpus is not None
    spec = placement_spec(config, {}, {"size": "big"}, cpus, created=0)
    assert spec.resources["Limits"]["NanoCPUs"] == 4 * 10**9  # counted against a small node: no limit at all
