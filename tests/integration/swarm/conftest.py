"""The session's Swarm cluster and the gateways on its nodes (:mod:`tests.swarm_fixtures`), and a
sandbox service on the host that places sandboxes on the cluster through them, for each test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests import swarm_fixtures
from tests.swarm_cluster import SwarmCluster
from tests.swarm_fixtures import SwarmService


def pytest_configure(config: pytest.Config) -> None:
    swarm_fixtures.load(config)


@pytest.fixture
async def swarm_service(swarm: SwarmCluster, gateways, docker_client,
                        sandbox_image: str) -> AsyncIterator[SwarmService]:
    """A started service whose ``[swarm]`` names the cluster's manager and gateways; stopped
    after the test, the Swarm services it left removed."""
    async with swarm_fixtures.swarm_service(swarm, gateways, docker_client.images.get(sandbox_image).id) as service:
        yield service
