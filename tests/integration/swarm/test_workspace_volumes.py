"""A node's gateway removes the workspace volumes of Swarm sandboxes that are gone, once they
settled, and only those: checked with :func:`~protolink.sandbox.leftovers.reap_workspaces` on the
host's engine."""

from __future__ import annotations

import secrets
import time
from contextlib import ExitStack

import pytest
from docker.types import Mount

from protolink.sandbox import leftovers
from tests.conftest import TEST_NAME_PREFIX

pytestmark = pytest.mark.docker


def test_a_workspace_volume_is_removed_once_no_container_uses_it_and_no_other_volume_is(docker_client,
                                                                                        sandbox_image: str):
    name = f"{TEST_NAME_PREFIX}ws-{secrets.token_hex(4)}"
    with ExitStack() as cleanup:
        workspace = docker_client.volumes.create(f"{name}-workspace", labels={leftovers.WORKSPACE_LABEL: name})
        cleanup.callback(_removed, workspace)
        other = docker_client.volumes.create(f"{name}-other")
        cleanup.callback(_removed, other)
        container = docker_client.containers.create(sandbox_image, mounts=[Mount("/workspace", workspace.name)],
                                                    name=name, network_mode="none")
        cleanup.callback(_removed, container)
        settled = time.time() + leftovers.WORKSPACE_SETTLE_SECONDS + 1
        assert workspace.name not in leftovers.reap_workspaces(docker_client, now=settled)  # its container holds it
        container.remove(force=True)
        assert workspace.name not in leftovers.reap_workspaces(docker_client)  # new: a task may be about to take it
        assert workspace.name in leftovers.reap_workspaces(docker_client, now=settled)
        assert [found.name for found in docker_client.volumes.list(filters={"name": name})] == [other.name]


def _removed(thing) -> None:
    """Remove a volume or container this test made, unless it is gone already."""
    import docker.errors

    try:
        thing.remove(force=True)
    except docker.errors.NotFound:
        pass
