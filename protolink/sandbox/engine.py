"""The Docker Engine as sandboxes use it: a client, and the one place its failures are translated.

The docker SDK reports what the engine refused as HTTP errors (``500 Server Error for
http+docker://localhost/v1.41/containers/.../start: ...``). :func:`engine_errors` turns those
raised in its block into :class:`~protolink.wire.status.SandboxEngineError`, whose message
says what is missing (an image, a runtime, the bridge TCP mode publishes through, the engine
itself) and still quotes the engine's own words. Blocking, like the SDK.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from typing import Any

from protolink.errors import SandboxEngineError

from .images import missing_image_hint

DEFAULT_HOST = "unix:///var/run/docker.sock"

#: The API version each engine (``DOCKER_HOST``) answered with: asking costs a round trip per client.
_api_versions: dict[str, str] = {}


def client() -> Any:
    """A docker SDK client for the environment's engine (``DOCKER_HOST``)."""
    import docker

    host = os.environ.get("DOCKER_HOST", "")
    made = docker.from_env(version=_api_versions.get(host, "auto"))
    _api_versions[host] = made.api.api_version
    return made


def create_container(client: Any, **kwargs: Any) -> Any:
    """Create a container as the SDK's ``client.containers.create(**kwargs)`` does (the same
    request, the same errors), without the inspection the SDK makes of it afterwards (a round
    trip on a cold sandbox's start). Blocking.

    Returns the SDK's ``Container`` whose ``attrs`` hold only its ``Id``: ``reload()`` it to read
    anything else. The request is built by ``_create_container_args``, the SDK's private function
    that ``containers.create`` calls (tests/integration/test_engine.py compares the two).
    """
    from docker.models.containers import _create_container_args

    created = client.api.create_container(**_create_container_args({**kwargs, "version": client.api.api_version}))
    return client.containers.prepare_model({"Id": created["Id"]})


#: How long removing a container may take in all. The engine answers a removal only once the
#: container's processes are dead: gVisor killing a fork bomb on a loaded machine needs longer
#: than one read of the SDK (60 s), and the engine goes on removing after the read gave up.
REMOVE_SECONDS = 300.0

#: How often a removal the engine is still busy with is asked about again.
_REMOVE_POLL_SECONDS = 0.5
#: How many times a removal that lost the engine's own race is tried in all (moby#52161: the
#: engine writes the container's state into its directory while it empties it, and answers
#: "unable to remove filesystem ... directory not empty"; the next removal finds it emptied).
_RACE_ATTEMPTS = 5


def remove_container(client: Any, container_id: str, *, volumes: bool = False,
                     seconds: float = REMOVE_SECONDS) -> None:
    """Remove a container by force and return once it is gone (blocking).

    A read that times out while the engine still works on it is asked again, as is "removal
    already in progress", until ``seconds`` have passed; an engine that stops answering ends the
    wait at once. A removal that lost the engine's race with its own writes into the container's
    directory is tried again, up to :data:`_RACE_ATTEMPTS` times in all. The SDK's error is
    raised as it came: translate it with :func:`engine_error`.
    """
    import docker.errors
    import requests.exceptions

    deadline = time.monotonic() + seconds
    races = 0
    while True:
        try:
            client.api.remove_container(container_id, force=True, v=volumes)
            return
        except docker.errors.NotFound:
            return
        except docker.errors.APIError as error:
            lost = _lost_race(error)
            races += lost
            again = error.status_code == HTTPStatus.CONFLICT or (lost and races < _RACE_ATTEMPTS)
            if not again or time.monotonic() >= deadline:
                raise
            time.sleep(_REMOVE_POLL_SECONDS)
        except requests.exceptions.ReadTimeout:
            if time.monotonic() >= deadline:
                raise


def _lost_race(error: Any) -> bool:
    """Whether a removal failed because the engine wrote into the container's directory while
    it emptied it (moby#52161)."""
    explanation = str(error.explanation or "")
    return "unable to remove filesystem" in explanation and "directory not empty" in explanation


@contextlib.contextmanager
def engine_errors(doing: str) -> Iterator[None]:
    """Raise the docker SDK's errors in this block as SandboxEngineError: "could not ``doing``: ..."."""
    try:
        yield
    except Exception as error:
        if not _from_engine(error):
            raise
        raise engine_error(error, doing) from error


def _from_engine(error: Exception) -> bool:
    """True for an error of the docker SDK or of requests, its HTTP client. Neither is imported
    here: an error cannot come from a module that was never loaded (``exec`` loads neither)."""
    sdk, http = sys.modules.get("docker.errors"), sys.modules.get("requests.exceptions")
    return ((sdk is not None and isinstance(error, sdk.DockerException))
            or (http is not None and isinstance(error, http.RequestException)))


def engine_error(error: Exception, doing: str) -> SandboxEngineError:
    """The typed error for a docker SDK error: what is missing, then what the engine said."""
    said = _engine_words(error)
    if _unanswered(error):
        return SandboxEngineError(f"could not {doing}: no Docker Engine answers at {_host()}: start one "
                                  f"(`make engine`, or scripts/engine-up.sh) (the client said: {said})")
    for pattern, missing in _MISSING:
        found = re.search(pattern, said, re.IGNORECASE)
        if found:
            return SandboxEngineError(f"could not {doing}: {missing(found)} (the engine said: {said})")
    return SandboxEngineError(f"could not {doing}: the engine said: {said}")


def _engine_words(error: Exception) -> str:
    """What the engine said, without the SDK's HTTP wrapping; the error's text when it said nothing."""
    explanation = getattr(error, "explanation", None)
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return (explanation or str(error)).strip() or type(error).__name__


def _unanswered(error: Exception) -> bool:
    """True when no engine answered: nothing listens at DOCKER_HOST, or the connection broke."""
    import docker.errors
    import requests.exceptions

    if isinstance(error, requests.exceptions.ConnectionError):
        return True
    return (isinstance(error, docker.errors.DockerException) and not isinstance(error, docker.errors.APIError)
            and str(error).startswith("Error while fetching server API version"))


def no_runtime(runtime: str) -> str:
    """What is missing when the engine has no runtime ``runtime``, and how to add it."""
    return (f"the engine has no runtime {runtime!r}: install it and register it in the engine's daemon.json "
            "(gVisor: see SECURITY.md)")


def _host() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


_NO_BRIDGE = ("and TCP mode publishes the server's port through it: {}, or use the Unix socket (no --tcp, "
              "no tcp=)")

#: Each refusal the engine is known to give: a pattern of its words, and what is missing.
_MISSING: tuple[tuple[str, Callable[[re.Match[str]], str]], ...] = (
    (r"No such image: (\S+)",
     lambda m: f"the image {m[1]} is not on this engine ({missing_image_hint(m[1])})"),
    (r"(?:unknown runtime specified|invalid runtime name):? (\S+)", lambda m: no_runtime(m[1])),
    (r'looking up the specified runtime path: exec: "([^"]+)"',
     lambda m: f"the engine knows the runtime, but its program {m[1]} is missing: install it (gVisor: see "
               "SECURITY.md)"),
    (r"could not find bridge (\S+?):",
     lambda m: f"the engine's bridge {m[1]} is missing, "
               + _NO_BRIDGE.format("restart the engine so that it creates it again")),
    (r"network bridge not found",
     lambda m: "the engine has no default bridge network, docker0 (dockerd --bridge=none?), "
               + _NO_BRIDGE.format("start the engine with its bridge")),
    (r"on network bridge:",
     lambda m: "the engine could not connect the container to its bridge network (docker0), "
               + _NO_BRIDGE.format("repair the engine's networking")),
    (r"bind source path does not exist: (\S+)",
     lambda m: f"the root {m[1]} does not exist where the engine runs (a remote engine mounts its own host's "
               "directories)"),
    (r"port is already allocated|address already in use",
     lambda m: "the TCP port is taken on the engine's host: choose another (HOST:0 picks a free one)"),
    (r'container name "/?([^"]+)" is already in use',
     lambda m: f"a container named {m[1]} already exists: remove it (docker rm -f {m[1]}) or choose another name"),
)
