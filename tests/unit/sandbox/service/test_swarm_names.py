"""A service on Swarm names a Swarm service after itself and each sandbox: the name must fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from protolink.sandbox.service.config import SwarmConfig
from protolink.sandbox.service.events import Events
from protolink.sandbox.service.on_swarm import SWARM_NAME_CHARS, OnSwarm


def swarm(tmp_path: Path) -> SwarmConfig:
    return SwarmConfig(manager="unix:///run/swarm-manager.sock", gateways={}, token_file=tmp_path / "token")


def test_a_service_name_that_leaves_room_for_its_sandboxes_is_taken(tmp_path: Path) -> None:
    assert OnSwarm("protolink-appliance", swarm(tmp_path), Events()).service == "protolink-appliance"
    assert OnSwarm("s" * (SWARM_NAME_CHARS - 34), swarm(tmp_path), Events())  # a dash, a tenant id, a dash, a sandbox id


def test_a_service_name_too_long_for_its_sandboxes_swarm_services_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too long for Swarm"):
        OnSwarm("s" * (SWARM_NAME_CHARS - 33), swarm(tmp_path), Events())
