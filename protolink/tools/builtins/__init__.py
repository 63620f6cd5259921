"""Built-in tool factories and their public types, one module per family.

Names load lazily, so importing this package pulls in no optional dependency.
"""

from __future__ import annotations

from protolink._lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "web_search": ".web",
    "fetch_url": ".fetch",
    "calculator": ".calculator",
    "current_datetime": ".clock",
    "process_tool": ".process",
    "ProcessSpec": ".process",
    "ProcessResult": ".process",
    "ExecutionBackend": ".process",
    "LocalExecutionBackend": ".process",
    "ProcessCancelledError": ".process",
    "shell_tool": ".shell",
    "git_tool": ".git",
    "ask_user_tool": ".user_input",
    "UserInputRequest": ".user_input",
    "UserInputResult": ".user_input",
    "filesystem_tools": ".filesystem",
    "storage_tools": ".storage",
    "http_tool": ".http",
    "document_tools": ".documents",
    "database_tools": ".database",
    "DatabaseBackend": ".database",
    "SQLiteDatabase": ".database",
    "calendar_tools": ".calendar",
    "CalendarBackend": ".calendar",
    "email_tools": ".email",
    "EmailBackend": ".email",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
