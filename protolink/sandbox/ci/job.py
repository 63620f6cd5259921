"""What a CI job is: a repository, its setup and test commands, and the bounds it runs within.

A :class:`CiJob` is frozen and checked when it is made; a value no job may have raises a
``ValueError`` that names the field, before anything slow happens.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..config import GiB, MiB
from ..egress.policy import EgressPolicy, parse_policy

#: The image name that selects the CI image (compilers, Node.js, Python headers).
CI_IMAGE = "ci"
#: What a JUnit or artifact pattern may look like: a relative glob, no "..", no absolute path.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class OutputLimits:
    """How much of the job comes out: ``command_output_bytes`` kept of each command's output
    (the rest is dropped and the command marked truncated), ``tail_bytes`` of it in the report;
    ``junit_file_bytes`` and ``junit_files``; ``artifact_file_bytes``, ``artifact_files`` and
    ``artifact_bytes`` in all."""

    command_output_bytes: int = 16 * MiB
    tail_bytes: int = 8 * 1024
    junit_file_bytes: int = 32 * MiB
    junit_files: int = 200
    artifact_file_bytes: int = 256 * MiB
    artifact_files: int = 1000
    artifact_bytes: int = 1 * GiB

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ci job: output limit {name} must be a whole number above 0, got {value!r}")


@dataclass(frozen=True)
class CiJob:
    """One run of an untrusted repository's build and tests.

    ``repo``: a local directory or a git URL (``https://``, ``http://``, ``ssh://``, ``git://``
    or ``user@host:path``). ``test``: the test command's argv (a name without a slash is looked
    up on the sandbox's PATH). ``setup``: shell commands (``/bin/sh -c``) run first, in order,
    with the egress ``allow`` list (``HOST[:PORT]`` rules; none: no network at all); the network
    is cut before the test command. ``image``: ``"ci"`` (the CI image), ``"sandbox"`` (the
    sandbox image), built when needed in a checkout, or any image holding the server. ``timeout_seconds`` bounds the whole job. ``junit``
    and ``artifacts``: globs relative to the repository (``**`` for any depth). ``env``: names of
    host variables passed in (their values never reach the report or the logs). ``ca_file``: a
    certificate authority bundle the setup's tools trust (an intercepting proxy), copied in.
    ``memory``, ``pids``, ``cpus`` and ``disk_bytes`` bound the sandbox (``cpus`` None: every CPU
    of the engine). ``runtime``: the engine's runtime, e.g. ``"runsc"``.
    """

    repo: str
    test: tuple[str, ...]
    setup: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    image: str = CI_IMAGE
    timeout_seconds: float = 1800.0
    junit: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    ca_file: Path | None = None
    memory: int = 4 * GiB
    pids: int = 2048
    cpus: float | None = None
    disk_bytes: int = 8 * GiB
    runtime: str | None = None
    limits: OutputLimits = field(default_factory=OutputLimits)

    def __post_init__(self) -> None:
        object.__setattr__(self, "test", tuple(self.test))
        for name in ("setup", "allow", "junit", "artifacts", "env"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"ci job: {name} must be a sequence of strings, got the string {value!r}")
            object.__setattr__(self, name, tuple(value))
        if not self.repo:
            raise ValueError("ci job: repo must name a directory or a git URL")
        if not self.test or not all(isinstance(arg, str) and "\0" not in arg for arg in self.test) or not self.test[0]:
            raise ValueError(f"ci job: test must be a non-empty argv of strings without NUL, got {self.test!r}")
        for command in self.setup:
            if not isinstance(command, str) or not command.strip() or "\0" in command:
                raise ValueError(f"ci job: a setup command must be a non-empty string without NUL, got {command!r}")
        parse_policy(self.allow)  # a rule it cannot parse raises here, naming the rule
        for pattern in (*self.junit, *self.artifacts):
            check_pattern(pattern)
        for name in self.env:
            if not _NAME.fullmatch(name):
                raise ValueError(f"ci job: env takes variable names, got {name!r}")
        if not (isinstance(self.timeout_seconds, (int, float)) and 0 < self.timeout_seconds < float("inf")):
            raise ValueError(f"ci job: timeout_seconds must be a number above 0, got {self.timeout_seconds!r}")
        if self.ca_file is not None:
            object.__setattr__(self, "ca_file", Path(self.ca_file))

    @property
    def egress(self) -> EgressPolicy:
        """The setup phase's egress policy (deny-all without ``allow``)."""
        return parse_policy(self.allow)

    def environment(self, host: dict[str, str] | None = None) -> dict[str, str]:
        """The variables named in ``env``, from ``host`` (this process's environment by
        default); one that is not set there raises ValueError."""
        host = dict(os.environ) if host is None else host
        missing = [name for name in self.env if name not in host]
        if missing:
            raise ValueError(f"ci job: --env names variables that are not set: {', '.join(missing)}")
        return {name: host[name] for name in self.env}


def check_pattern(pattern: str) -> str:
    """``pattern`` when it is a relative glob inside the repository; ValueError otherwise."""
    parts = pattern.replace("\\", "/").split("/")
    if not pattern or pattern.startswith("/") or ".." in parts or "\0" in pattern:
        raise ValueError(f"ci job: a --junit or --artifacts pattern must be a relative glob inside the "
                         f"repository, without '..', got {pattern!r}")
    return pattern
