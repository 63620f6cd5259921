"""The public names the spec documents are importable from where the spec says."""

import importlib

import pytest

import protolink
import protolink.tools
import protolink.tools.builtins

SPEC_TOOL_FACTORIES = {
    "web_search": ["web_search"],
    "fetch_url": ["fetch_url"],
    "calculator": ["calculator"],
    "current_datetime": ["current_datetime"],
    "process_tool": ["execute_command"],
    "shell_tool": ["run_shell"],
    "git_tool": ["git"],
    "ask_user_tool": ["ask_user"],
    "filesystem_tools": ["read_file", "list_files", "search_files"],
    "storage_tools": ["get_value", "list_keys"],
    "http_tool": ["http_request"],
    "document_tools": ["read_document", "search_document"],
    "database_tools": ["database_schema", "query_database"],
    "calendar_tools": ["list_calendar_events"],
    "email_tools": ["list_email_messages", "read_email"],
}

SPEC_TYPES = {
    "protolink": ["Agent", "AgentCard", "CapabilityPolicy", "ApprovalDecision", "ApprovalRequest",
                  "StorageCheckpointStore", "Assistant"],
    "protolink.llm": ["ScriptedModel", "OpenAICompatibleModel"],
    "protolink.storage": ["InMemoryStorage", "SQLiteStorage", "Storage"],
    "protolink.tools": ["UserInputRequest", "SQLiteDatabase", "GoogleCalendar", "Gmail", "OutlookCalendar",
                        "OutlookEmail", "IMAPEmail", *SPEC_TOOL_FACTORIES],
    "protolink.tools.builtins": ["process_tool", "filesystem_tools", "ProcessSpec", "ProcessResult",
                                 "ExecutionBackend", "LocalExecutionBackend", "ProcessCancelledError"],
    "protolink.core.resources": ["FilesystemResource", "ResourceRevision", "ResourceSnapshot",
                                 "ResourceChange", "CheckpointStore", "StorageCheckpointStore"],
}


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in SPEC_TYPES.items() for n in names])
def test_documented_name_is_importable(module, name):
    assert getattr(importlib.import_module(module), name) is not None


def test_every_catalog_factory_is_exported_from_both_packages():
    for factory in SPEC_TOOL_FACTORIES:
        assert getattr(protolink.tools, factory) is getattr(protolink.tools.builtins, factory)


def test_process_cancelled_error_is_native_cancellation():
    import asyncio

    from protolink.tools.builtins import ProcessCancelledError

    assert issubclass(ProcessCancelledError, asyncio.CancelledError)


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError):
        protolink.tools.not_a_tool  # noqa: B018
    with pytest.raises(AttributeError):
        protolink.NotAThing  # noqa: B018


def test_top_level_exports_match_the_core_package():
    import protolink.core

    assert set(protolink.core.__all__) <= set(protolink.__all__)
