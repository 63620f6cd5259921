"""Where a command runs and which file it executes, resolved before anyone approves it.

The rules (the spec's "Command execution"):

- the working directory is an absolute path to an existing directory; symbolic links are
  resolved so the preview names the directory the process really starts in;
- the executable is an absolute path, an explicit relative path (it contains ``/``) taken
  relative to that directory, or a bare name looked up in the absolute entries of the
  ``PATH`` of the *supplied* environment. The host's own ``PATH`` is never consulted.

The preview also names the file ``argv[0]`` runs (its real path: a virtualenv's ``python`` is a
symbolic link), and a backend checks just before it starts the process that ``argv[0]`` still
resolves to that file (:func:`check_real_executable`).

These functions block on the file system; async callers use
:meth:`LocalProcesses.resolve_command <protolink.execution.processes.LocalProcesses.resolve_command>`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple


class Resolved(NamedTuple):
    """A command resolved before approval: argv with argv[0] resolved, the real working
    directory, and the real path of the file argv[0] runs."""

    argv: tuple[str, ...]
    cwd: str
    real_executable: str


def check_command(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> None:
    """The checks that need no file system: an argv, an absolute cwd, a passable environment."""
    if not argv:
        raise ValueError("argv must contain at least the executable")
    check_arguments(argv)
    check_environment(env)
    _check_text("working directory", cwd)
    if not os.path.isabs(cwd):
        raise ValueError(f"working directory must be an absolute path, got {cwd!r}")


def resolve_directory(path: str) -> str:
    """The real path of an existing working directory given as an absolute path."""
    _check_text("working directory", path)
    if not os.path.isabs(path):
        raise ValueError(f"working directory must be an absolute path, got {path!r}")
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise missing_directory(path)
    return real


def missing_directory(path: str) -> ValueError:
    """The error for a working directory ``path`` that names no directory."""
    return ValueError(f"working directory {path!r} does not exist or is not a directory")


def resolve_executable(name: str, *, cwd: str, env: Mapping[str, str]) -> str:
    """The absolute path of the executable ``name`` names (see the module rules)."""
    for candidate in executable_candidates(name, cwd=cwd, env=env):
        if _is_executable_file(candidate):
            return candidate
    raise missing_executable(name, cwd=cwd, env=env)


def missing_executable(name: str, *, cwd: str, env: Mapping[str, str]) -> ValueError:
    """The error for a ``name`` none of whose candidates is an executable file."""
    if "/" in name:
        return ValueError(f"executable {name!r} is not an executable file (looked at {os.path.join(cwd, name)!r})")
    return ValueError(f"executable {name!r} was not found on the supplied PATH {env['PATH']!r}")


def executable_candidates(name: str, *, cwd: str, env: Mapping[str, str]) -> Iterator[str]:
    """The files ``name`` may name, in order (the executable is the first that is an executable
    file); ``cwd`` is the resolved working directory (``"."`` leaves relative candidates
    relative to it). ValueError, when iterated, if ``name`` cannot name one."""
    _check_text("executable", name)
    if not name:
        raise ValueError("executable must not be empty")
    if "/" in name:
        # An absolute name stays as it is. A relative one is joined, not normalized: ".." after
        # a symbolic link means what the kernel says, and the preview must name that file.
        yield os.path.join(cwd, name)
        return
    search_path = env.get("PATH")
    if not search_path:
        raise ValueError(
            f"executable {name!r} is a bare name but the environment has no PATH; "
            "supply an absolute path, an explicit relative path, or a PATH entry in env"
        )
    for entry in search_path.split(os.pathsep):
        if os.path.isabs(entry):
            yield os.path.join(entry, name)


def resolve_command(argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
    """The command resolved by the module rules; the environment is checked, not changed."""
    check_command(argv, cwd, env)
    directory = resolve_directory(cwd)
    executable = resolve_executable(argv[0], cwd=directory, env=env)
    return Resolved((executable, *argv[1:]), directory, os.path.realpath(executable))


def check_real_executable(executable: str, approved: str) -> None:
    """ValueError when ``executable`` no longer resolves to the file ``approved`` (its real path
    when the command was resolved): a symbolic link on its way was changed since."""
    real = os.path.realpath(executable)
    if real != approved:
        raise changed_executable(executable, real, approved)


def changed_executable(executable: str, real: str, approved: str) -> ValueError:
    """The error for an ``executable`` that now runs ``real`` instead of the ``approved`` file."""
    return ValueError(f"{executable!r} now resolves to {real!r}, not to the {approved!r} resolved before "
                      "approval; nothing was started")


def check_arguments(arguments: Sequence[str]) -> None:
    """Reject arguments that cannot be passed to a process."""
    for argument in arguments:
        _check_text("argument", argument)


def check_environment(env: Mapping[str, str]) -> None:
    """Reject names and values that cannot be passed to a process."""
    for key, value in env.items():
        _check_text("environment variable name", key)
        _check_text(f"environment variable {key!r}", value)
        if not key or "=" in key:
            raise ValueError(f"invalid environment variable name {key!r}")


def _check_text(what: str, value: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{what} must not contain a NUL character")


def _is_executable_file(path: str) -> bool:
    # Effective ids: the sandbox's workers resolve commands with the command user's effective
    # uid but a real uid of their own.
    effective = os.access in os.supports_effective_ids
    return os.path.isfile(path) and os.access(path, os.X_OK, effective_ids=effective)
