"""What a sandbox's Swarm service records of its template's placement, and what a restarted
service reads back from a manager's listing of it: the runtime and the node labels."""

from __future__ import annotations

from typing import Any

from protolink.sandbox.config import SandboxConfig
from protolink.sandbox.service import labels
from protolink.sandbox.service.config import Template
from protolink.sandbox.service.sandboxes import adopted_service
from protolink.sandbox.service.swarm import adopted_template, placement_spec

#: What the service's other labels give back of a template (name, image, limits, times).
READ_BACK = Template(name="gvisor", image="protolink/sandbox:x")


def listed(config: SandboxConfig, node_labels: dict[str, str]) -> dict[str, Any]:
    """The manager's listing entry of the service :func:`placement_spec` makes (its labels)."""
    owner = {labels.TENANT: "alice", labels.SANDBOX: "0123456789abcdef", labels.TEMPLATE: "gvisor"}
    spec = placement_spec(config, owner, node_labels, node_cpus=4, created=1_700_000_000)
    return {"Spec": {"Name": spec.name, "Labels": dict(spec.labels)}}


def test_the_runtime_and_node_labels_survive_a_restart():
    found = listed(SandboxConfig(roots=(), runtime="runsc"), {"zone": "eu", "disk": "ssd"})
    template = adopted_template(READ_BACK, found)
    assert (template.runtime, template.node_labels) == ("runsc", (("disk", "ssd"), ("zone", "eu")))
    assert (template.name, template.image) == (READ_BACK.name, READ_BACK.image)


def test_a_template_without_either_reads_back_without_either():
    template = adopted_template(READ_BACK, listed(SandboxConfig(roots=()), {}))
    assert (template.runtime, template.node_labels) == (None, ())



def test_a_restarted_service_adopts_a_sandbox_with_its_runtime_and_node_labels():
    placed = adopted_service(listed(SandboxConfig(roots=(), runtime="runsc"), {"zone": "eu"}), now=1_700_000_100)
    assert placed is not None
    assert (placed.id, placed.template.name) == ("0123456789abcdef", "gvisor")
    assert (placed.template.runtime, placed.template.node_labels) == ("runsc", (("zone", "eu"),))
