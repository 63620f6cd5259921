"""Root test configuration: the policy for tests that need a Docker Engine.

A test marked ``@pytest.mark.docker``, or one that uses the ``docker_client`` fixture, runs only
when an engine answers; one marked ``@pytest.mark.root`` only as root. Otherwise it is skipped,
unless ``PROTOLINK_REQUIRE_DOCKER=1`` (CI), where it fails instead: a CI run must not pass by
skipping. ``make test-fast`` runs what needs neither.

At the end of a session that reached an engine, the suite's containers (labelled
``io.protolink.owner``) that were created during the session and are still there fail the run.
A container is the suite's when its owner is this process or a process that has ended (a test's
subprocess), or when its name starts with :data:`TEST_NAME_PREFIX` (an appliance or a raw
container a test made). The prefix holds a random part of its own per session, so a sandbox of
another live process on the same engine, or another test session's appliance, is not.
"""

from __future__ import annotations

import functools
import os
import secrets

import pytest

OWNER_LABEL = "io.protolink.owner"
PROBE_TIMEOUT_SECONDS = 5
#: How tests name the appliances and raw containers they make: one prefix per session (see the module).
TEST_NAME_PREFIX = f"pltest-{secrets.token_hex(2)}-"

_leak_baseline: set[str] | None = None
_leaked: list[str] = []


def _labelled_containers(client) -> dict[str, str]:
    # One listing, no look at each container after it: one removed meanwhile is simply not there,
    # and one the engine is removing (it lists it without a name) is as good as gone: its removal
    # was asked for, and an engine slow to finish it (after an out-of-memory storm) leaks nothing.
    found = {}
    for container in client.api.containers(all=True, filters={"label": OWNER_LABEL}):
        if container.get("State") == "removing" or not container.get("Names"):
            continue
        name, owner = container["Names"][0].lstrip("/"), container["Labels"][OWNER_LABEL]
        if _the_suites(name, owner):
            found[container["Id"]] = f"{container['Id'][:12]} {name} ({OWNER_LABEL}={owner})"
    return found


def _the_suites(name: str, owner: str) -> bool:
    """Whether a container belongs to this test session (see the module)."""
    from protolink.sandbox.leftovers import owner_gone, process_owner

    return name.startswith(TEST_NAME_PREFIX) or owner == process_owner() or owner_gone(owner)


@functools.cache
def _engine_problem() -> str | None:
    """Why no Docker Engine can be used, or None when one answers. Probed once per session."""
    global _leak_baseline
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install -e '.[sandbox]')"
    try:
        client = docker.from_env(timeout=PROBE_TIMEOUT_SECONDS)  # asks the engine its API version
        try:
            client.ping()
            _leak_baseline = set(_labelled_containers(client))
        finally:
            client.close()
    except Exception as exc:
        host = os.environ.get("DOCKER_HOST", "the default socket")
        return f"Docker Engine at {host} does not answer: {exc}"
    return None


def _require(problem: str | None) -> None:
    """Skip for ``problem`` (None: none), or fail under PROTOLINK_REQUIRE_DOCKER=1 (CI), where
    nothing may pass by skipping."""
    if problem is None:
        return
    if os.environ.get("PROTOLINK_REQUIRE_DOCKER") == "1":
        pytest.fail(f"PROTOLINK_REQUIRE_DOCKER=1 but {problem}", pytrace=False)
    pytest.skip(problem)


def _require_engine() -> None:
    problem = _engine_problem()
    _require(None if problem is None else f"{problem} (start one: scripts/engine-up.sh)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker"):
        _require_engine()
    if item.get_closest_marker("root"):
        _require(None if os.geteuid() == 0 else "this test needs root (other uids, pid namespaces, chown)")


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client for the session's engine, under the same skip-or-fail policy."""
    _require_engine()
    import docker

    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_client) -> str:
    """The sandbox image of this checkout, built first when its inputs changed (with progress)."""
    import sys

    from protolink.sandbox.provision import ensure_image

    return ensure_image(progress=lambda line: print(line, file=sys.__stderr__, flush=True))


@pytest.fixture(scope="session")
def ci_image(docker_client) -> str:
    """The CI image of this checkout (``--image ci``), built first when its inputs changed."""
    import sys

    from protolink.sandbox.provision import ensure_image

    return ensure_image("ci", progress=lambda line: print(line, file=sys.__stderr__, flush=True))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _leak_baseline is None:
        return
    import docker

    client = docker.from_env(timeout=PROBE_TIMEOUT_SECONDS)
    try:
        current = _labelled_containers(client)
    finally:
        client.close()
    _leaked[:] = [desc for cid, desc in current.items() if cid not in _leak_baseline]
    if _leaked:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if _leaked:
        terminalreporter.section("leaked containers", red=True)
        for desc in _leaked:
            terminalreporter.line(f"left behind: {desc}", red=True)
