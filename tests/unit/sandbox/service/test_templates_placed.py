"""A template's runtime and node labels reach the sandbox it starts: its container's runtime on
the host's engine, its Swarm service's constraints and gVisor tuning on Swarm."""

from __future__ import annotations

import pytest

from protolink.sandbox.config import MiB
from protolink.sandbox.service.config import Overrides, ServiceConfig
from protolink.sandbox.service.sandboxes import new_placed, sandbox_config
from protolink.sandbox.service.swarm import placement_spec

SWARM = '[swarm]\nmanager = "unix:///m.sock"\ngateway_token_file = "/t"\nnodes = {}\n'
TEMPLATES = """
[templates.default]
[templates.isolated]
runtime = "runsc"
pids = 256
node_labels = { zone = "eu", disk = "ssd" }
"""


def _config(tmp_path, text: str) -> ServiceConfig:
    path = tmp_path / "service.toml"
    path.write_text(text)
    return ServiceConfig.load(path, image="base:1")


def test_a_template_names_a_runtime_and_node_labels(tmp_path):
    config = _config(tmp_path, TEMPLATES + SWARM)
    isolated, default = config.template("isolated"), config.template("default")
    assert (isolated.runtime, isolated.node_labels) == ("runsc", (("disk", "ssd"), ("zone", "eu")))
    assert (default.runtime, default.node_labels) == (None, ())
    assert Overrides(memory_bytes=128 * MiB).applied(isolated).node_labels == isolated.node_labels


@pytest.mark.parametrize(("text", "refusal"), [
    (TEMPLATES, "node_labels place sandboxes on Swarm nodes; this service has no \\[swarm\\] table"),
    ('[templates.default]\nnode_labels = { zone = 1 }\n' + SWARM, "node_labels is a table of labels"),
    ('[templates.default]\nnode_labels = ["zone"]\n' + SWARM, "node_labels is a table of labels"),
])
def test_node_labels_that_cannot_be_used_are_refused(tmp_path, text, refusal):
    with pytest.raises(ValueError, match=refusal):
        _config(tmp_path, text)


def test_the_runtime_reaches_a_sandbox_on_the_hosts_engine(tmp_path):
    config = _config(tmp_path, "[templates.default]\n[templates.gvisor]\nruntime = \"runsc\"\n")
    for name, runtime in (("gvisor", "runsc"), ("default", None)):
        placed = new_placed("0123456789abcdef", "tenant", config.template(name), Overrides())
        assert sandbox_config("svc", placed, (), "svc.tenant.0123456789abcdef").runtime == runtime


def test_node_labels_and_the_runtime_become_the_swarm_services_constraints_and_tuning(tmp_path):
    config = _config(tmp_path, TEMPLATES + SWARM)
    placed = new_placed("0123456789abcdef", "tenant", config.template("isolated"), Overrides())
    sandbox = sandbox_config("svc", placed, (), "svc-tenant-0123456789abcdef")
    spec = placement_spec(sandbox, {"io.protolink.service.sandbox": placed.id}, dict(placed.template.node_labels),
                          node_cpus=4, created=1_700_000_000)
    assert spec.placement == {"Constraints": ["node.labels.disk==ssd", "node.labels.io.protolink.runtime==runsc",
                                              "node.labels.zone==eu"]}
    assert spec.resources["Limits"]["Pids"] == 256 * 8  # gVisor's host threads, as on the host's engine
    plain = new_placed("0123456789abcdef", "tenant", config.template("default"), Overrides())
    spec = placement_spec(sandbox_config("svc", plain, (), "svc-tenant-0123456789abcdef"), {}, {}, node_cpus=4,
                          created=1_700_000_000)
    assert spec.placement == {"Constraints": ["node.labels.io.protolink.runtime!=runsc"]}  # never a gVisor node
    assert spec.resources["Limits"]["Pids"] == 256  # the template's own
