"""docs/images.md states what the image recipe really sets, and the build script takes only the
images it knows by name."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from protolink.sandbox.cli import COMMAND_ENV
from protolink.sandbox.config import NOBODY
from protolink.sandbox.placements.server import CAPABILITIES, SECRET_DIR, SOCKET_DIR
from protolink.sandbox.images import BUILT_IMAGES, built_kind
from protolink.sandbox.provision import SCRIPTS
from protolink_sandboxd.spawner import PROGRAM

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "images.md").read_text()
DOCKERFILE = (ROOT / "images" / "sandbox" / "Dockerfile").read_text()
SCRIPT = (SCRIPTS / "build-images.sh").read_text()
REQUIREMENTS = DOC.split("## What an image must contain", 1)[1]


def _script_packages(variable: str) -> list[str]:
    value = re.search(rf"^{variable}=(\S+)$", SCRIPT, re.MULTILINE)
    assert value is not None, f"{variable} is not set in build-images.sh"
    return value[1].replace("$BASE_PACKAGES,", "").split(",")


def test_the_requirements_quote_the_dockerfiles_entrypoint():
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", DOCKERFILE, re.MULTILINE)
    assert entrypoint is not None
    assert f"ENTRYPOINT {json.dumps(json.loads(entrypoint[1]))}" in REQUIREMENTS


def test_the_requirements_name_the_paths_the_server_uses():
    spawner_copy = re.search(r"^COPY bin/protolink-spawner (\S+)$", DOCKERFILE, re.MULTILINE)
    assert spawner_copy is not None and spawner_copy[1] == PROGRAM
    assert "python3 -m venv /opt/protolink" in DOCKERFILE and "git config --system --add safe.directory '*'" in DOCKERFILE
    for fact in (PROGRAM, "`/opt/protolink`", "python3 -m venv", SOCKET_DIR, SECRET_DIR,
                 "git config --system --add safe.directory '*'", f"PATH={COMMAND_ENV['PATH']}"):
        assert fact in REQUIREMENTS, fact


def test_the_requirements_state_the_hardening_the_placement_sets():
    assert f"uid {NOBODY}" in REQUIREMENTS
    kept = ", ".join(f"`{cap}`" for cap in CAPABILITIES[:-1]) + f" and `{CAPABILITIES[-1]}`"
    assert f"every capability dropped but {kept}" in REQUIREMENTS


@pytest.mark.parametrize(("kind", "variables"), [("sandbox", ["BASE_PACKAGES"]), ("ci", ["CI_BASE_PACKAGES"])])
def test_the_table_lists_each_bases_packages(kind: str, variables: list[str]):
    row = _table_row(kind)
    packages = [package for variable in variables for package in _script_packages(variable)]
    assert packages and all(package in row for package in packages), (row, packages)
    assert BUILT_IMAGES[kind][1] in row and BUILT_IMAGES[kind][0].removesuffix(":latest") in row


def test_the_table_names_the_ci_bases_node_and_npm_releases():
    row = _table_row("ci")
    for variable in ("CI_NODE", "CI_NPM"):
        spec = re.search(rf"^{variable}=(\S+)@(\S+)$", SCRIPT, re.MULTILINE)
        assert spec is not None, f"{variable} is not set in build-images.sh"
        assert f"`{spec[1]}` {spec[2]}" in row, (row, spec[0])


def _table_row(kind: str) -> str:
    return next(line for line in DOC.splitlines() if line.startswith(f"| `{kind}`"))


def test_names_and_latest_tags_select_the_built_images():
    assert [built_kind(name) for name in ("sandbox", "ci", "protolink/sandbox:latest", "protolink/ci:latest")] == [
        "sandbox", "ci", "sandbox", "ci"]
    assert built_kind("protolink/ci:0123456789abcdef") is None and built_kind("debian:bookworm") is None


def test_the_build_script_refuses_an_unknown_image_before_doing_anything():
    done = subprocess.run(["bash", str(SCRIPTS / "build-images.sh"), "cii"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "usage: build-images.sh [sandbox|ci] (not 'cii')" in done.stderr and done.stdout == ""
