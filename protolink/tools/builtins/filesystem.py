"""filesystem_tools(): bounded reads, listing and search beneath explicit roots, and, with
checkpoints, recoverable writes.

Reads run on the configured workspace backend (the host by default, or a sandbox), which
applies the descriptor-based path rules next to the files. Writes snapshot the target while
preparing, show the unified diff and exact preimage for approval, record a checkpoint on this
host, then replace the file only if it still matches what was approved.
"""

from __future__ import annotations

import asyncio
import difflib
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from protolink.core.resources import (
    ChangeInspection,
    CheckpointStore,
    ResourceChange,
    apply_change,
    inspect_change,
    load_change,
    restore_change,
)
from protolink.core.tools import Artifact, Preparation, PreparedTool, ToolContext
from protolink.execution.backends import WorkspaceBackend
from protolink.execution.filesystem import DEFAULT_MAX_FILE_BYTES, FilesystemResource
from protolink.execution.fsread import MAX_READ_CHARS, decode_text
from protolink.execution.fssearch import MAX_RESULTS
from protolink.execution.fswrite import CREATE_MODE
from protolink.execution.paths import MAX_PATH_CHARS, canonical_roots, canonical_target
from protolink.revisions import ResourceSnapshot

READ, WRITE, RESTORE = "filesystem.read", "filesystem.write", "filesystem.restore"
READ_TAGS = ("builtin", "filesystem", "read-only")
WRITE_TAGS = ("builtin", "filesystem", "write")

_PATH = Field(min_length=1, max_length=MAX_PATH_CHARS, description="Absolute path beneath a configured root.")
_DIRECTORY = Field(min_length=1, max_length=MAX_PATH_CHARS,
                   description="Absolute path of a directory beneath a configured root.")
_PATTERN = Field(default="*", min_length=1, max_length=256, description="Filename glob, such as '*.py'.")
_MAX_RESULTS = Field(default=100, ge=1, le=MAX_RESULTS, description=f"Maximum items returned (1–{MAX_RESULTS}).")
_CHANGE_ID = Field(min_length=1, max_length=128, description="change_id returned by a file write.")


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReadFileArguments(_Arguments):
    path: str = _PATH
    offset: int = Field(default=0, ge=0, description="Unicode character offset to start from (next_offset).")
    max_chars: int = Field(default=MAX_READ_CHARS, ge=1, le=MAX_READ_CHARS,
                           description=f"Maximum characters returned (1–{MAX_READ_CHARS}).")


class ListFilesArguments(_Arguments):
    path: str = _DIRECTORY
    pattern: str = _PATTERN
    recursive: bool = Field(default=False, description="Also list subdirectories' entries.")
    max_results: int = _MAX_RESULTS


class SearchFilesArguments(_Arguments):
    path: str = _DIRECTORY
    query: str = Field(min_length=1, description="Literal text to find within one line.")
    pattern: str = _PATTERN
    case_sensitive: bool = False
    max_results: int = _MAX_RESULTS


class WriteFileArguments(_Arguments):
    path: str = _PATH
    content: str = Field(description="The complete new UTF-8 text of the file.")


class EditFileArguments(_Arguments):
    path: str = _PATH
    old_text: str = Field(min_length=1, description="Exact, case-sensitive text to replace.")
    new_text: str = Field(description="Replacement text.")
    replace_all: bool = Field(default=False, description=(
        "Replace every occurrence, left to right without overlap; required when there are several "
        "(overlapping occurrences count as several)."))


class ChangeArguments(_Arguments):
    change_id: str = _CHANGE_ID


def filesystem_tools(
    *,
    roots: Iterable[str | os.PathLike[str]],
    checkpoints: CheckpointStore | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    backend: WorkspaceBackend | None = None,
) -> list[PreparedTool]:
    """Create ``read_file``, ``list_files`` and ``search_files`` (``filesystem.read``).

    Supplying ``checkpoints`` adds ``create_file``, ``replace_file``, ``edit_file``
    (``filesystem.write``), ``preview_change`` (``filesystem.read``) and ``restore_change``
    (``filesystem.restore``). ``roots`` are existing absolute directories, resolved now to
    their real paths. A requested path may spell a root through its real path or through an
    alias (symlinks outside every root, such as macOS ``/tmp``); results, approvals and
    recovery records always name files through the root's real path. Files larger than
    ``max_file_bytes`` are not read, searched or written. ``backend`` is where the files are
    (the host by default); aliases are resolved here, so it only ever sees real paths.
    """
    resolved = canonical_roots(roots)
    if max_file_bytes < 1:
        raise ValueError("max_file_bytes must be >= 1")
    if backend is None:
        from protolink.execution.local import LocalExecutionBackend

        backend = LocalExecutionBackend()
    if not isinstance(backend, WorkspaceBackend):
        raise TypeError(f"backend must implement WorkspaceBackend, not {type(backend).__name__}")
    reads = _Reads(resolved, backend, max_file_bytes)
    tools = reads.tools()
    if checkpoints is not None:
        resource = FilesystemResource(resolved, backend=backend, max_file_bytes=max_file_bytes)
        tools += _Writes(resource, checkpoints).tools()
    return tools


class _Reads:
    def __init__(self, roots: Sequence[str], backend: WorkspaceBackend, max_file_bytes: int) -> None:
        self.roots = roots
        self.backend = backend
        self.max_file_bytes = max_file_bytes

    def tools(self) -> list[PreparedTool]:
        return [
            _read_tool(
                "read_file",
                "Read a UTF-8 text file beneath the configured roots. Returns path, content and next_offset "
                "(character offset to continue from, or null at the end). Symlinks, special files, binary "
                "and invalid UTF-8 files are rejected.",
                ReadFileArguments, self.prepare_read, _READ_SCHEMA),
            _read_tool(
                "list_files",
                "List entries of a directory whose names match a glob, optionally recursively. Items have "
                "path, type (file, directory, or other for symlinks and special files) and size. Check "
                "truncated and skipped before treating the listing as complete.",
                ListFilesArguments, self.prepare_list, _listing_schema(_ENTRY_SCHEMA)),
            _read_tool(
                "search_files",
                "Recursively find lines containing literal text in UTF-8 files whose names match a glob. "
                "Items have path, one-based line, text (at most 500 characters) and text_truncated. Binary, "
                "unreadable and oversized files are skipped; check truncated and skipped before treating an "
                "empty result as exhaustive.",
                SearchFilesArguments, self.prepare_search, _listing_schema(_MATCH_SCHEMA)),
        ]

    async def prepare_read(self, args: ReadFileArguments, ctx: ToolContext) -> Preparation:
        return await self._prepared(args.path, lambda path: self.backend.read_text(
            path, roots=self.roots, offset=args.offset, max_chars=args.max_chars,
            max_file_bytes=self.max_file_bytes))

    async def prepare_list(self, args: ListFilesArguments, ctx: ToolContext) -> Preparation:
        return await self._prepared(args.path, lambda path: self.backend.list_files(
            path, roots=self.roots, pattern=args.pattern, recursive=args.recursive, max_results=args.max_results))

    async def prepare_search(self, args: SearchFilesArguments, ctx: ToolContext) -> Preparation:
        return await self._prepared(args.path, lambda path: self.backend.search_files(
            path, roots=self.roots, query=args.query, pattern=args.pattern, case_sensitive=args.case_sensitive,
            max_results=args.max_results, max_file_bytes=self.max_file_bytes))

    async def _prepared(self, path: str, call: Callable[[str], Awaitable[Any]]) -> Preparation:
        """A read of the canonical ``path``; a path outside the roots fails here, before authorization."""
        canonical = (await asyncio.to_thread(canonical_target, path, self.roots)).path

        async def execute(ctx: ToolContext) -> dict[str, Any]:
            return (await call(canonical)).to_dict()

        return Preparation(execute=execute, capabilities=(READ,))


class _Writes:
    def __init__(self, resource: FilesystemResource, checkpoints: CheckpointStore) -> None:
        self.resource = resource
        self.checkpoints = checkpoints

    def tools(self) -> list[PreparedTool]:
        def write_tool(name: str, description: str, arguments: type[BaseModel], prepare: Any) -> PreparedTool:
            return PreparedTool(name=name, description=description, arguments=arguments, prepare=prepare,
                                capabilities=(WRITE,), tags=WRITE_TAGS, output_schema=_CHANGE_SCHEMA)

        return [
            write_tool("create_file", "Create a new UTF-8 file (mode 0600) in an existing directory; the "
                       "target must not exist. Returns the recovery change_id.",
                       WriteFileArguments, self.prepare_create),
            write_tool("replace_file", "Replace the whole content of an existing UTF-8 file, keeping its "
                       "mode. Returns the recovery change_id.", WriteFileArguments, self.prepare_replace),
            write_tool("edit_file", "Replace exact, case-sensitive text in an existing UTF-8 file; several "
                       "matches, overlapping ones included, need replace_all=true, which replaces them left to "
                       "right without overlap. Returns the recovery change_id.",
                       EditFileArguments, self.prepare_edit),
            _read_tool(
                "preview_change",
                "Show a recorded file change: the diff that restoring it would apply, its saved state, "
                "whether the file has changed since (conflict) and whether the change's outcome is uncertain.",
                ChangeArguments, self.prepare_preview, _PREVIEW_SCHEMA),
            PreparedTool(
                name="restore_change",
                description=("Restore the file a recorded change modified: its previous bytes and mode, "
                             "or remove a file it created. The file must still hold exactly what the "
                             "change wrote."),
                arguments=ChangeArguments, prepare=self.prepare_restore, capabilities=(RESTORE,),
                tags=WRITE_TAGS, output_schema=_CHANGE_SCHEMA,
            ),
        ]

    async def prepare_create(self, args: WriteFileArguments, ctx: ToolContext) -> Preparation:
        before = await self.resource.read(args.path)
        if before.exists:
            raise FileExistsError(f"{before.resource_id} already exists; use replace_file or edit_file")
        return self._write(before, None, args.content, CREATE_MODE)

    async def prepare_replace(self, args: WriteFileArguments, ctx: ToolContext) -> Preparation:
        before, text, mode = await self._existing_text(args.path)
        return self._write(before, text, args.content, mode)

    async def prepare_edit(self, args: EditFileArguments, ctx: ToolContext) -> Preparation:
        """Every offset ``old_text`` starts at is a match ("aa" occurs twice in "aaa"); replace_all
        replaces them as str.replace does, left to right without overlap."""
        before, text, mode = await self._existing_text(args.path)
        matches = _match_count(text, args.old_text)
        if matches == 0:
            raise ValueError(f"old_text does not occur in {before.resource_id}")
        if matches > 1 and not args.replace_all:
            replaced = text.count(args.old_text)  # what replace_all replaces
            what = "every occurrence" if replaced == matches else f"{replaced} of them, left to right without overlap"
            raise ValueError(f"old_text occurs {matches} times in {before.resource_id}; "
                             f"set replace_all=true to replace {what}")
        edited = text.replace(args.old_text, args.new_text, -1 if args.replace_all else 1)
        return self._write(before, text, edited, mode)

    async def prepare_preview(self, args: ChangeArguments, ctx: ToolContext) -> Preparation:
        await load_change(self.checkpoints, args.change_id)

        async def execute(ctx: ToolContext) -> dict[str, Any]:
            inspection = await inspect_change(self.resource, self.checkpoints, args.change_id)
            return {
                **_change_ids(inspection.change),
                "uncertain": inspection.uncertain,
                "conflict": inspection.conflict,
                "diff": _restoration_diff(inspection),
                "error": inspection.change.error,
            }

        return Preparation(execute=execute, capabilities=(READ,))

    async def prepare_restore(self, args: ChangeArguments, ctx: ToolContext) -> Preparation:
        inspection = await inspect_change(self.resource, self.checkpoints, args.change_id)
        current = inspection.require_restorable()
        path = current.resource_id
        artifacts = (
            Artifact("diff", f"Restore {path}", _restoration_diff(inspection)),
            Artifact("preimage", f"Current {path}", _preimage(current, _text_or_none(current.data))),
        )

        async def execute(ctx: ToolContext) -> dict[str, Any]:
            change = await restore_change(self.resource, self.checkpoints, args.change_id, expected=current)
            return _change_ids(change)

        return Preparation(execute=execute, capabilities=(RESTORE,), artifacts=artifacts)

    async def _existing_text(self, path: str) -> tuple[ResourceSnapshot, str, int]:
        """The snapshot of an existing UTF-8 file, its text and its mode bits."""
        before = await self.resource.read(path)
        mode = before.revision.mode
        if before.data is None or mode is None:
            raise FileNotFoundError(f"{before.resource_id} does not exist; use create_file")
        return before, decode_text(before.data, before.resource_id), mode

    def _write(self, before: ResourceSnapshot, old: str | None, new: str, mode: int) -> Preparation:
        path = before.resource_id
        data = _encode(new, path)
        if len(data) > self.resource.max_file_bytes:
            raise ValueError(f"new content of {path} is {len(data)} bytes; the limit is {self.resource.max_file_bytes}")
        artifacts = (Artifact("diff", f"Change {path}", _unified_diff(path, old, new)),
                     Artifact("preimage", f"Current {path}", _preimage(before, old)))

        async def execute(ctx: ToolContext) -> dict[str, Any]:
            change = await apply_change(self.resource, self.checkpoints, before, data, mode,
                                        action_id=ctx.action_id, run_id=ctx.run_id, task_id=ctx.task_id)
            return _change_ids(change)

        return Preparation(execute=execute, capabilities=(WRITE,), artifacts=artifacts)


def _read_tool(name: str, description: str, arguments: type[BaseModel], prepare: Any,
               output_schema: dict[str, Any]) -> PreparedTool:
    return PreparedTool(name=name, description=description, arguments=arguments, prepare=prepare,
                        capabilities=(READ,), tags=READ_TAGS, output_schema=output_schema)


def _match_count(text: str, old: str) -> int:
    """How many offsets of ``text`` ``old`` starts at, overlapping matches included."""
    count, at = 0, text.find(old)
    while at != -1:
        count, at = count + 1, text.find(old, at + 1)
    return count


def _encode(text: str, path: str) -> bytes:
    if "\0" in text:
        raise ValueError(f"content for {path} contains NUL characters; files are UTF-8 text")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"content for {path} is not encodable as UTF-8: {error.reason}") from None


def _unified_diff(path: str, old: str | None, new: str | None) -> str:
    """A unified diff; None stands for an absent file."""
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True),
        fromfile=path if old is not None else "/dev/null", tofile=path if new is not None else "/dev/null")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _restoration_diff(inspection: ChangeInspection) -> str | None:
    """The diff restoring would apply to the current file; None when it cannot be read as text."""
    current, before = inspection.current, inspection.change.before
    if current is None:
        return None
    now, was = _text_or_none(current.data), _text_or_none(before.data)
    if (now is None and current.exists) or (was is None and before.exists):
        return None
    return _unified_diff(current.resource_id, now, was)


def _text_or_none(data: bytes | None) -> str | None:
    """``data`` as text; None when absent, binary or not UTF-8."""
    if data is None:
        return None
    try:
        return decode_text(data, "")
    except ValueError:
        return None


def _preimage(snapshot: ResourceSnapshot, text: str | None) -> dict[str, Any]:
    revision = snapshot.revision
    return {"path": revision.resource_id, "exists": revision.exists, "sha256": revision.sha256,
            "size": revision.size, "mode": revision.mode, "content": text}


def _change_ids(change: ResourceChange) -> dict[str, Any]:
    return {"change_id": change.change_id, "path": change.resource_id, "operation": change.operation,
            "state": change.state, "action_id": change.action_id, "run_id": change.run_id,
            "task_id": change.task_id}


_NULLABLE_STRING = {"type": ["string", "null"]}
_READ_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"},
                   "next_offset": {"type": ["integer", "null"]}},
    "required": ["path", "content", "next_offset"],
}
_ENTRY_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "type": {"enum": ["file", "directory", "other"]},
                   "size": {"type": ["integer", "null"]}},
    "required": ["path", "type"],
}
_MATCH_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "line": {"type": "integer", "minimum": 1},
                   "text": {"type": "string", "maxLength": 500}, "text_truncated": {"type": "boolean"}},
    "required": ["path", "line", "text", "text_truncated"],
}
_CHANGE_PROPERTIES = {
    "change_id": {"type": "string"}, "path": {"type": "string"}, "operation": {"enum": ["create", "replace"]},
    "state": {"enum": ["prepared", "applied", "restoring", "restored", "failed", "uncertain"]},
    "action_id": _NULLABLE_STRING, "run_id": _NULLABLE_STRING, "task_id": _NULLABLE_STRING,
}
_CHANGE_SCHEMA = {"type": "object", "properties": _CHANGE_PROPERTIES, "required": ["change_id", "path", "state"]}
_PREVIEW_SCHEMA = {
    "type": "object",
    "properties": {**_CHANGE_PROPERTIES, "uncertain": {"type": "boolean"}, "conflict": {"type": "boolean"},
                   "diff": _NULLABLE_STRING, "error": _NULLABLE_STRING},
    "required": ["change_id", "path", "state", "uncertain", "conflict", "diff"],
}


def _listing_schema(item: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"items": {"type": "array", "items": item}, "scanned": {"type": "integer"},
                       "skipped": {"type": "integer"}, "truncated": {"type": "boolean"}},
        "required": ["items", "scanned", "skipped", "truncated"],
    }
