"""What the Docker Engine refuses reaches the user as a typed error saying what is missing, with
the engine's own words and without the SDK's HTTP wrapping (the engine's texts are real ones)."""

from __future__ import annotations

from http import HTTPStatus

import pytest
import requests
from docker import errors

from protolink.errors import SandboxEngineError, SandboxUnavailableError
from protolink.sandbox.engine import engine_error, engine_errors

START = "http+docker://localhost/v1.41/containers/0123456789ab/start"


def api_error(cls: type[errors.APIError], status: int, explanation: str) -> errors.APIError:
    response = requests.Response()
    response.status_code, response.url, response.reason = status, START, HTTPStatus(status).phrase
    return cls(requests.HTTPError(response=response), response=response, explanation=explanation)


NO_DOCKER0 = ("failed to create endpoint protolink-sandbox-1 on network bridge: adding interface veth5e0c1a2 to "
              "bridge docker0 failed: could not find bridge docker0: route ip+net: no such network interface")

KNOWN = [
    (api_error(errors.APIError, 500, NO_DOCKER0), "bridge docker0 is missing, and TCP mode publishes"),
    (api_error(errors.NotFound, 404, "network bridge not found"), "no default bridge network, docker0"),
    (api_error(errors.ImageNotFound, 404, "No such image: protolink/sandbox:gone"),
     "the image protolink/sandbox:gone is not on this engine (pull it where a registry is reachable, or build it)"),
    (api_error(errors.ImageNotFound, 404, "No such image: protolink/ci:latest"),
     "the image protolink/ci:latest is not on this engine (build it with `make ci-image` in a protolink checkout)"),
    (api_error(errors.APIError, 400, "Unknown runtime specified runsc"), "the engine has no runtime 'runsc'"),
    (api_error(errors.APIError, 400, 'error while looking up the specified runtime path: exec: "/usr/bin/runsc": '
                                     "stat /usr/bin/runsc: no such file or directory"),
     "its program /usr/bin/runsc is missing"),
    (api_error(errors.APIError, 500, "driver failed programming external connectivity on endpoint x (1a2b): "
                                     "Bind for 127.0.0.1:7000 failed: port is already allocated"),
     "the TCP port is taken"),
    (api_error(errors.APIError, 409, 'Conflict. The container name "/box" is already in use by container "1a2b".'),
     "a container named box already exists"),
    (api_error(errors.APIError, 400, "invalid mount config for type \"bind\": bind source path does not exist: /srv/ws"),
     "the root /srv/ws does not exist where the engine runs"),
]


@pytest.mark.parametrize(("error", "missing"), KNOWN, ids=[missing for _, missing in KNOWN])
def test_a_known_refusal_says_what_is_missing_and_what_the_engine_said(error, missing):
    translated = engine_error(error, "start sandbox container box")
    assert isinstance(translated, SandboxEngineError) and isinstance(translated, SandboxUnavailableError)
    text = str(translated)
    assert text.startswith("could not start sandbox container box: ") and missing in text
    assert f"(the engine said: {error.explanation})" in text
    assert "http+docker" not in text and "Server Error" not in text and "Client Error" not in text


def test_an_unknown_refusal_still_gives_the_engines_words():
    error = api_error(errors.APIError, 500, "something no one has seen yet")
    assert str(engine_error(error, "remove sandbox container box")) == (
        "could not remove sandbox container box: the engine said: something no one has seen yet")


@pytest.mark.parametrize("error", [
    errors.DockerException("Error while fetching server API version: ('Connection aborted.', "
                           "FileNotFoundError(2, 'No such file or directory'))"),
    requests.exceptions.ConnectionError("('Connection aborted.', ConnectionRefusedError(111, 'Connection refused'))"),
])
def test_an_engine_that_does_not_answer_is_named(error, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/nowhere.sock")
    text = str(engine_error(error, "start sandbox container box"))
    assert "no Docker Engine answers at unix:///run/nowhere.sock" in text and "make engine" in text


def test_the_block_translates_engine_errors_and_nothing_else():
    with pytest.raises(SandboxEngineError, match="no runtime 'runsc'") as raised:
        with engine_errors("start sandbox container box"):
            raise api_error(errors.APIError, 400, "Unknown runtime specified runsc")
    assert isinstance(raised.value.__cause__, errors.APIError)
    with pytest.raises(ValueError, match="^mine$"):
        with engine_errors("start sandbox container box"):
            raise ValueError("mine")
