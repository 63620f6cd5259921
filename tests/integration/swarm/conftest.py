"""A three-node Swarm cluster of real engines, built once for the test module beside it and
removed after it (:mod:`tests.swarm_cluster`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TEST_NAME_PREFIX
from tests.swarm_cluster import SwarmCluster, remove_orphans

#: Sandbox slots each node advertises: one, so that where sandboxes go shows the slots at work.
SLOTS = 1


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host directory every node holds at the same path: where sandbox roots are made."""
    return tmp_path_factory.mktemp("swarm-roots")


@pytest.fixture(scope="module")
def swarm(docker_client, sandbox_image: str, shared_dir: Path) -> Iterator[SwarmCluster]:
    """The cluster, with this checkout's sandbox image on every node; removed at the end, as are
    the clusters of test runs that were killed."""
    remove_orphans(docker_client)
    with SwarmCluster(docker_client, TEST_NAME_PREFIX, nodes=3, slots=SLOTS, shared=[shared_dir]) as cluster:
        loading = time.monotonic()
        cluster.load_image(sandbox_image)
        figures = cluster.figures
        print(f"swarm: built in {figures.build_seconds:.1f} s, joins "
              f"{', '.join(f'{s:.2f} s' for s in figures.join_seconds)}, idle nodes "
              f"{', '.join(f'{b / 2**20:.0f} MiB' for b in figures.node_memory)}, image loaded in "
              f"{time.monotonic() - loading:.1f} s", file=sys.__stderr__, flush=True)
        yield cluster
