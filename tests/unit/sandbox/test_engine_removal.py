"""A container's removal waits for the engine as long as the engine answers, not one read's timeout:
killing a container's many processes (gVisor beside a fork bomb) can take minutes on a busy host."""

from __future__ import annotations

from http import HTTPStatus

import pytest
import requests
from docker import errors

from protolink.sandbox import engine

REMOVE = "http+docker://localhost/v1.41/containers/0123456789ab?v=False&link=False&force=True"


def api_error(cls: type[errors.APIError], status: int, explanation: str) -> errors.APIError:
    response = requests.Response()
    response.status_code, response.url, response.reason = status, REMOVE, HTTPStatus(status).phrase
    return cls(requests.HTTPError(response=response), response=response, explanation=explanation)


READ_TIMED_OUT = requests.exceptions.ReadTimeout("UnixHTTPConnectionPool(host='localhost', port=None): "
                                                 "Read timed out. (read timeout=60)")
IN_PROGRESS = api_error(errors.APIError, 409, "removal of container 0123456789ab is already in progress")
GONE = api_error(errors.NotFound, 404, "No such container: 0123456789ab")


class Engine:
    """Answers each removal with the next of ``answers`` (an error to raise, or None for done)."""

    def __init__(self, *answers: Exception | None) -> None:
        self.api = self
        self.answers = list(answers)
        self.calls: list[tuple[str, bool, bool]] = []

    def remove_container(self, container: str, *, force: bool, v: bool) -> None:
        self.calls.append((container, force, v))
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_REMOVE_POLL_SECONDS", 0.0)


def test_a_removal_the_engine_answers_late_is_asked_again_until_the_container_is_gone():
    late = Engine(READ_TIMED_OUT, IN_PROGRESS, IN_PROGRESS, GONE)
    engine.remove_container(late, "0123456789ab", volumes=True)
    assert late.calls == [("0123456789ab", True, True)] * 4


def test_a_removal_that_succeeds_at_once_asks_once():
    prompt = Engine(None)
    engine.remove_container(prompt, "0123456789ab")
    assert prompt.calls == [("0123456789ab", True, False)]


def test_a_container_already_gone_is_removed():
    engine.remove_container(Engine(GONE), "0123456789ab")


def test_a_refusal_is_raised_at_once():
    refused = api_error(errors.APIError, 500, "driver failed to remove root filesystem: device or resource busy")
    failing = Engine(refused, None)
    with pytest.raises(errors.APIError, match="device or resource busy"):
        engine.remove_container(failing, "0123456789ab")
    assert len(failing.calls) == 1


LOST_RACE = api_error(errors.APIError, 500, "unable to remove filesystem for 0123456789ab: unlinkat "
                      "/var/lib/docker/containers/0123456789ab: directory not empty")


def test_a_removal_that_lost_the_engines_race_with_its_own_writes_is_tried_again():
    """moby#52161: the engine wrote the container's state into its directory while emptying it."""
    raced = Engine(LOST_RACE, LOST_RACE, None)
    engine.remove_container(raced, "0123456789ab", volumes=True)
    assert len(raced.calls) == 3


def test_a_removal_that_keeps_losing_that_race_is_raised_after_a_few_attempts():
    always = Engine(*[LOST_RACE] * 10)
    with pytest.raises(errors.APIError, match="directory not empty"):
        engine.remove_container(always, "0123456789ab")
    assert len(always.calls) == engine._RACE_ATTEMPTS


def test_an_engine_that_stops_answering_ends_the_wait():
    gone = requests.exceptions.ConnectionError("('Connection aborted.', FileNotFoundError(2, 'No such file'))")
    with pytest.raises(requests.exceptions.ConnectionError):
        engine.remove_container(Engine(READ_TIMED_OUT, gone, None), "0123456789ab")


def test_the_wait_ends_at_its_deadline_with_the_engines_last_answer():
    busy = Engine(READ_TIMED_OUT, GONE)
    with pytest.raises(requests.exceptions.ReadTimeout):
        engine.remove_container(busy, "0123456789ab", seconds=0.0)
    assert len(busy.calls) == 1
