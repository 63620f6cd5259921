"""git_tool: six Git operations with literal paths, option-proof revisions and no repository code.

Every invocation runs ``git`` with system and global configuration, terminal prompts, optional
locks, hooks, fsmonitor, signing, external diff, textconv and the pager disabled. Repository
configuration still applies, and staging clean filters may execute code: read and write
capabilities classify operations, they do not sandbox an untrusted repository.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field

from protolink.core.tools import Preparation, PreparedTool, ToolContext
from protolink.execution.backends import ExecutionBackend
from protolink.execution.git_safety import GLOBAL_OPTIONS, git_environment
from protolink.execution.local import LocalExecutionBackend

from .process import (
    PROCESS_EXECUTE,
    PROCESS_RESULT_SCHEMA,
    ConfiguredCommand,
    arguments_model,
    configured_environment,
)

GIT_READ = "git.read"
GIT_WRITE = "git.write"
READ_OPERATIONS = ("status", "diff", "log", "show")
WRITE_OPERATIONS = ("add", "commit")

#: The optional arguments each operation accepts; any other argument must keep its default.
OPERATION_OPTIONS: dict[str, frozenset[str]] = {
    "status": frozenset({"paths"}),
    "diff": frozenset({"paths", "revision", "staged"}),
    "log": frozenset({"paths", "revision", "max_count"}),
    "show": frozenset({"paths", "revision"}),
    "add": frozenset({"paths"}),
    "commit": frozenset({"message"}),
}
_DEFAULTS: dict[str, Any] = {
    "paths": None, "revision": None, "staged": False, "message": None, "max_count": 10,
}

DIFF_OPTIONS = ("--no-ext-diff", "--no-textconv")
#: Beyond the host, commands run as a user of the backend's own (a sandbox's unprivileged uid)
#: that rarely owns the mounted repository; Git's ownership check protects a host user from
#: another user's repository configuration, which the boundary already contains there.
FOREIGN_OWNER_OPTIONS = ("-c", "safe.directory=*")

#: A conservative revision: refs, hashes, ``~``/``^`` ancestry, ``@{...}`` and ``..`` ranges;
#: never an option, a pathspec (``:``) or whitespace.
_REVISION = re.compile(r"[A-Za-z0-9_@][A-Za-z0-9_@./{}^~+-]{0,255}")


def git_tool(
    *,
    cwd: str,
    allow_write: bool = False,
    env: Mapping[str, str] | None = None,
    executable: str = "git",
    timeout_seconds: float = 60,
    max_output_bytes: int = 65536,
    backend: ExecutionBackend | None = None,
) -> PreparedTool:
    """Create ``git``: status, diff, log and show; add and commit only with ``allow_write``.

    Without ``allow_write`` the write operations are absent from the advertised operation
    enum. Each call needs ``process.execute`` plus ``git.read`` or ``git.write``. ``env=None``
    supplies only ``PATH=os.defpath``. On a backend whose boundary is not the host (a
    sandbox), Git's repository-ownership check is off: commands there run as the backend's own
    unprivileged user. The directory and executable are resolved at
    registration on the host backend without launching a process. Invalid paths, revisions
    and unsupported option combinations fail before authorization.
    """
    backend = backend if backend is not None else LocalExecutionBackend()
    command = ConfiguredCommand(
        backend, executable, cwd=cwd, env=git_environment(configured_environment(env)),
        timeout_seconds=timeout_seconds, max_output_bytes=max_output_bytes,
    )
    operations = READ_OPERATIONS + (WRITE_OPERATIONS if allow_write else ())
    arguments = arguments_model(
        "GitArguments",
        operation=(Literal[operations], Field(description="The Git operation to run.")),
        paths=(list[str] | None, Field(None, description=(
            "Literal paths relative to the repository directory (status, diff, log, show; "
            "required for add)."))),
        revision=(str | None, Field(None, description=(
            "Revision for diff, log or show (log and show default to HEAD)."))),
        staged=(bool, Field(False, description="diff only: compare the index, not the worktree.")),
        message=(str | None, Field(None, description="commit only: the nonblank commit message.")),
        max_count=(int, Field(10, ge=1, le=100, description="log only: number of commits.")),
    )

    ownership = FOREIGN_OWNER_OPTIONS if backend.boundary != "host" else ()

    async def prepare(args: Any, context: ToolContext) -> Preparation:
        options = {name: getattr(args, name) for name in _DEFAULTS}
        access = GIT_WRITE if args.operation in WRITE_OPERATIONS else GIT_READ
        return await command.prepare([*ownership, *git_arguments(args.operation, **options)],
                                     (PROCESS_EXECUTE, access), title=f"git {args.operation} in {{cwd}}")

    return PreparedTool(
        name="git",
        description=(
            "Run a Git operation in the configured repository: "
            + ", ".join(operations)
            + ". Paths are literal and relative to the repository directory."
        ),
        arguments=arguments,
        prepare=prepare,
        capabilities=(PROCESS_EXECUTE, GIT_READ, *((GIT_WRITE,) if allow_write else ())),
        tags=("builtin", "git", *(() if allow_write else ("read-only",))),
        output_schema=PROCESS_RESULT_SCHEMA,
    )


def git_arguments(
    operation: str,
    *,
    paths: Sequence[str] | None = None,
    revision: str | None = None,
    staged: bool = False,
    message: str | None = None,
    max_count: int = 10,
) -> list[str]:
    """Everything after the executable for one operation; ValueError for what the spec rejects."""
    if operation not in OPERATION_OPTIONS:
        raise ValueError(f"unsupported git operation {operation!r}")
    given = {"paths": paths, "revision": revision, "staged": staged, "message": message,
             "max_count": max_count}
    unsupported = sorted(name for name, value in given.items()
                         if value != _DEFAULTS[name] and name not in OPERATION_OPTIONS[operation])
    if unsupported:
        raise ValueError(f"git {operation} does not accept {', '.join(unsupported)}")
    pathspecs = [check_path(path) for path in paths or ()]
    if revision is not None:
        check_revision(revision)
    if operation == "status":
        command = ["status", "--short", "--branch"]
    elif operation == "diff":
        command = ["diff", *DIFF_OPTIONS, *(["--staged"] if staged else [])]
        if revision is not None:
            command += ["--end-of-options", revision]
    elif operation == "log":
        command = ["log", *DIFF_OPTIONS, f"--max-count={max_count}", "--end-of-options",
                   revision or "HEAD"]
    elif operation == "show":
        command = ["show", *DIFF_OPTIONS, "--end-of-options", revision or "HEAD"]
    elif operation == "add":
        if not pathspecs:
            raise ValueError("git add needs a nonempty list of paths")
        command = ["add", "--all"]
    else:
        if message is None or not message.strip():
            raise ValueError("git commit needs a nonblank message")
        if "\0" in message:
            raise ValueError("commit message must not contain a NUL character")
        return [*GLOBAL_OPTIONS, "commit", "-m", message]
    return [*GLOBAL_OPTIONS, *command, "--", *pathspecs]


def check_path(path: str) -> str:
    """A literal path relative to the configured directory: not absolute, no ``..`` part."""
    if not path or "\0" in path:
        raise ValueError(f"invalid path {path!r}: paths must be nonempty without NUL characters")
    if os.path.isabs(path):
        raise ValueError(f"path {path!r} is absolute; paths are relative to the repository directory")
    if ".." in path.split("/"):
        raise ValueError(f"path {path!r} has a '..' component")
    return path


def check_revision(revision: str) -> str:
    """A revision that can only ever be read as a revision, never as an option or path."""
    if not _REVISION.fullmatch(revision):
        raise ValueError(
            f"invalid revision {revision!r}: use a ref, hash, ~/^ ancestry, @{{...}} or a "
            "'..' range (letters, digits and _@./{}^~+-, not starting with '-' or '.')"
        )
    return revision
