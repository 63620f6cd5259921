"""A node's gateway removes the workspace volumes of Swarm sandboxes that are gone, and only
those: checked with :func:`~protolink.sandbox.leftovers.reap_workspaces` on the host's engine."""

from __future__ import annotations

import secrets
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
        assert workspace.name not in leftovers.reap_workspaces(docker_client)  # its container holds it
        container.remove(force=True)
        assert workspace.name in leftovers.reap_workspaces(docker_client)
        assert [found.name for found in docker_client.volumes.list(filters={"name": name})] == [other.name]


def _removed(thing) -> None:
    """Remove a volume or container this test made, unless it is gone already."""
    import docker.errors

    try:
        thing.remove(force=True)
    except docker.errors.NotFound:
        pass
