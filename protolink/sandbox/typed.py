"""A command as a person types it (``protolink-sandbox exec``, ``SyncSandbox.run``): the
environment it gets, and where a bare name is looked up. Imports nothing: ``exec`` is timed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: What a typed command's environment holds.
COMMAND_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def command_env(settings: Sequence[str], host: Mapping[str, str]) -> dict[str, str]:
    """COMMAND_ENV with ``settings`` applied in order, as ``docker exec --env`` takes them:
    ``NAME=VALUE`` sets NAME (a later setting wins); a bare ``NAME`` passes this host's value.
    ValueError for an empty name, or a bare name this host has not set."""
    env = dict(COMMAND_ENV)
    for setting in settings:
        name, given, value = setting.partition("=")
        if not name:
            raise ValueError(f"--env takes NAME=VALUE or NAME, got {setting!r}")
        if not given:
            if name not in host:
                raise ValueError(f"--env {name}: {name} is not set here (give its value: --env {name}=VALUE)")
            value = host[name]
        env[name] = value
    return env


#: What looks a typed bare name up in the sandbox's ``PATH``.
LOOKUP = "/usr/bin/env"


def typed_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` to run: an absolute ``argv[0]`` as it is; a bare name is looked up in the
    sandbox's ``PATH`` there (through :data:`LOOKUP`), never on the host."""
    return list(argv) if argv[0].startswith("/") else [LOOKUP, "--", *argv]


def as_typed(message: str, argv: Sequence[str]) -> str:
    """``message`` (a command's failure to start) naming ``argv[0]`` as typed where it names
    the :data:`LOOKUP` that :func:`typed_argv` put in front of a bare name."""
    if argv[0].startswith("/"):
        return message
    return message.replace(f"could not start {LOOKUP!r}", f"could not start {argv[0]!r}", 1)
