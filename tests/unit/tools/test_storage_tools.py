"""storage_tools(): JSON values in one map per Storage namespace, through an Agent."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from protolink import Agent, AgentCard, CapabilityPolicy
from protolink.errors import StorageError, ToolArgumentError
from protolink.storage import InMemoryStorage, SQLiteStorage
from protolink.tools import storage_tools


@pytest.fixture(params=["memory", "sqlite"])
def storage(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        yield InMemoryStorage("tool-values")
    else:
        store = SQLiteStorage(tmp_path / "values.db", namespace="tool-values")
        yield store
        store.close()


def agent_with(storage, **options: Any) -> Agent:
    agent = Agent(AgentCard(name="keeper"))
    for tool in storage_tools(storage, **options):
        agent.add_tool(tool)
    return agent


def test_reads_by_default_and_writes_only_when_allowed(storage):
    read_only = storage_tools(storage)
    assert {tool.name: tool.capabilities for tool in read_only} == {
        "get_value": ("storage.read",), "list_keys": ("storage.read",)}
    writable = storage_tools(storage, allow_write=True)
    assert {tool.name: tool.capabilities for tool in writable} == {
        "get_value": ("storage.read",), "list_keys": ("storage.read",),
        "set_value": ("storage.write",), "delete_value": ("storage.write",)}


async def test_set_get_delete_round_trip(storage):
    agent = agent_with(storage, allow_write=True)
    assert await agent.call_tool("set_value", key="profile", value={"name": "Ada", "tags": ["x"]}) == {
        "key": "profile", "created": True}
    assert await agent.call_tool("set_value", key="profile", value={"name": "Bob"}) == {
        "key": "profile", "created": False}
    assert await agent.call_tool("get_value", key="profile") == {
        "key": "profile", "found": True, "value": {"name": "Bob"}}
    assert await agent.call_tool("delete_value", key="profile") == {"key": "profile", "deleted": True}
    assert await agent.call_tool("get_value", key="profile") == {"key": "profile", "found": False, "value": None}


async def test_stored_null_is_found_and_missing_is_not(storage):
    agent = agent_with(storage, allow_write=True)
    await agent.call_tool("set_value", key="nothing", value=None)
    assert await agent.call_tool("get_value", key="nothing") == {"key": "nothing", "found": True, "value": None}
    assert await agent.call_tool("get_value", key="absent") == {"key": "absent", "found": False, "value": None}


async def test_the_namespace_holds_one_json_object(storage):
    agent = agent_with(storage, allow_write=True)
    await agent.call_tool("set_value", key="a", value=1)
    await agent.call_tool("set_value", key="b", value=[True, "x"])
    assert storage.keys() == ["values"]
    assert storage.get("values") == {"a": 1, "b": [True, "x"]}


async def test_results_are_detached_copies(storage):
    agent = agent_with(storage, allow_write=True)
    await agent.call_tool("set_value", key="doc", value={"items": [1, 2]})
    first = await agent.call_tool("get_value", key="doc")
    first["value"]["items"].append(3)
    assert (await agent.call_tool("get_value", key="doc"))["value"] == {"items": [1, 2]}


async def test_deleting_an_absent_key_is_a_no_op_that_writes_nothing(storage):
    agent = agent_with(storage, allow_write=True)
    await agent.call_tool("set_value", key="kept", value=1)
    updates = []
    original = storage.update
    storage.update = lambda key, fn: updates.append(key) or original(key, fn)
    assert await agent.call_tool("delete_value", key="never-set") == {"key": "never-set", "deleted": False}
    assert updates == []
    assert storage.get("values") == {"kept": 1}


async def test_deleting_the_last_key_empties_the_namespace(storage):
    agent = agent_with(storage, allow_write=True)
    await agent.call_tool("set_value", key="only", value=1)
    await agent.call_tool("delete_value", key="only")
    assert storage.keys() == []


@pytest.mark.parametrize("key", ["", "   ", "\t\n", "k" * 257])
async def test_keys_are_nonblank_and_at_most_256_characters(storage, key):
    agent = agent_with(storage, allow_write=True)
    for tool, extra in (("get_value", {}), ("set_value", {"value": 1}), ("delete_value", {})):
        with pytest.raises(ToolArgumentError):
            await agent.call_tool(tool, key=key, **extra)
    assert storage.keys() == []


async def test_a_256_character_key_is_accepted(storage):
    agent = agent_with(storage, allow_write=True)
    await agent.call_tool("set_value", key="k" * 256, value="v")
    assert (await agent.call_tool("get_value", key="k" * 256))["value"] == "v"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), {"deep": [1, float("-inf")]}])
async def test_non_finite_numbers_are_rejected_before_approval(storage, value):
    asked = []

    async def approve(request, run):
        asked.append(request)
        return True

    agent = Agent(AgentCard(name="keeper"), policy=CapabilityPolicy({"storage.write": "require_approval"}),
                  approval_handler=approve)
    for tool in storage_tools(storage, allow_write=True):
        agent.add_tool(tool)
    with pytest.raises(ValueError, match="finite"):
        await agent.call_tool("set_value", key="x", value=value)
    assert asked == []
    assert storage.keys() == []


async def test_oversized_values_are_rejected_before_approval(storage):
    agent = agent_with(storage, allow_write=True, max_value_bytes=20)
    await agent.call_tool("set_value", key="small", value="x" * 18)  # 20 bytes as JSON
    with pytest.raises(ValueError, match="21 bytes of JSON; the limit is 20"):
        await agent.call_tool("set_value", key="big", value="x" * 19)
    with pytest.raises(ValueError, match="limit is 20"):
        await agent.call_tool("set_value", key="wide", value="é" * 10)  # 22 UTF-8 bytes
    assert storage.get("values") == {"small": "x" * 18}


async def test_the_key_count_limit_keeps_the_store_unchanged(storage):
    agent = agent_with(storage, allow_write=True, max_keys=2)
    await agent.call_tool("set_value", key="a", value=1)
    await agent.call_tool("set_value", key="b", value=2)
    with pytest.raises(ValueError, match="3 keys; the limit is 2"):
        await agent.call_tool("set_value", key="c", value=3)
    await agent.call_tool("set_value", key="b", value=20)
    assert storage.get("values") == {"a": 1, "b": 20}


async def test_the_store_size_limit_keeps_the_store_unchanged(storage):
    agent = agent_with(storage, allow_write=True, max_store_bytes=40)
    await agent.call_tool("set_value", key="a", value="x" * 20)  # {"a":"xxx..."} is 28 bytes
    with pytest.raises(ValueError, match="the limit is 40"):
        await agent.call_tool("set_value", key="b", value="y" * 10)
    assert storage.get("values") == {"a": "x" * 20}


async def test_list_keys_sorts_filters_by_literal_prefix_and_pages(storage):
    agent = agent_with(storage, allow_write=True)
    for key in ["user:2", "user:10", "team:1", "user:1", "user.*", "u%er"]:
        await agent.call_tool("set_value", key=key, value=key)
    assert await agent.call_tool("list_keys") == {
        "keys": ["team:1", "u%er", "user.*", "user:1", "user:10", "user:2"], "next_offset": None}
    first = await agent.call_tool("list_keys", prefix="user:", limit=2)
    assert first == {"keys": ["user:1", "user:10"], "next_offset": 2}
    second = await agent.call_tool("list_keys", prefix="user:", offset=first["next_offset"], limit=2)
    assert second == {"keys": ["user:2"], "next_offset": None}
    assert (await agent.call_tool("list_keys", prefix="user.*"))["keys"] == ["user.*"]
    assert (await agent.call_tool("list_keys", prefix="u%"))["keys"] == ["u%er"]
    assert await agent.call_tool("list_keys", offset=50) == {"keys": [], "next_offset": None}


@pytest.mark.parametrize("arguments", [{"limit": 0}, {"limit": 1001}, {"offset": -1}, {"prefix": "p" * 257}])
async def test_list_keys_arguments_are_bounded(storage, arguments):
    with pytest.raises(ToolArgumentError):
        await agent_with(storage).call_tool("list_keys", **arguments)


async def test_list_keys_accepts_a_limit_of_1000(storage):
    agent = agent_with(storage, allow_write=True)
    await agent.call_tool("set_value", key="a", value=1)
    assert (await agent.call_tool("list_keys", limit=1000))["keys"] == ["a"]


async def test_writes_show_an_exact_preview_for_approval(storage):
    previews = []

    async def approve(request, run):
        previews.append([artifact.to_dict() for artifact in request.action.artifacts])
        return False

    agent = Agent(AgentCard(name="keeper"), policy=CapabilityPolicy({"storage.write": "require_approval"}),
                  approval_handler=approve)
    for tool in storage_tools(storage, allow_write=True):
        agent.add_tool(tool)
    with pytest.raises(PermissionError):
        await agent.call_tool("set_value", key="plan", value={"step": 1})
    with pytest.raises(PermissionError):
        await agent.call_tool("delete_value", key="plan")
    assert [preview[0]["content"] for preview in previews] == [
        {"operation": "set", "key": "plan", "value": {"step": 1}},
        {"operation": "delete", "key": "plan"},
    ]
    assert storage.keys() == []


async def test_a_namespace_holding_something_else_is_a_storage_error(storage):
    storage.put("values", ["not", "a", "map"])
    agent = agent_with(storage, allow_write=True)
    with pytest.raises(StorageError, match="not the JSON object"):
        await agent.call_tool("get_value", key="a")
    with pytest.raises(StorageError):
        await agent.call_tool("set_value", key="a", value=1)
    assert storage.get("values") == ["not", "a", "map"]


def test_factory_arguments_are_checked(storage):
    with pytest.raises(TypeError):
        storage_tools({"not": "a storage"})
    with pytest.raises(ValueError, match="max_keys"):
        storage_tools(storage, max_keys=0)


async def test_sqlite_values_persist_across_instances(tmp_path):
    first = SQLiteStorage(tmp_path / "app.db", namespace="tool-values")
    await agent_with(first, allow_write=True).call_tool("set_value", key="k", value={"n": 1})
    first.close()
    second = SQLiteStorage(tmp_path / "app.db", namespace="tool-values")
    try:
        result = await agent_with(second).call_tool("get_value", key="k")
        assert result == {"key": "k", "found": True, "value": {"n": 1}}
    finally:
        second.close()


class RacyStorage(InMemoryStorage):
    """A Storage whose update is not atomic: it reads, pauses, then writes."""

    def update(self, key: str, fn: Callable[[Any | None], Any | None]) -> Any | None:
        current = self.get(key)
        time.sleep(0.002)
        new = fn(current)
        if new is None:
            self.delete(key)
        else:
            self.put(key, new)
        return new


def test_the_bundle_lock_serializes_its_tools_across_threads():
    storage = RacyStorage("racy")
    agent = agent_with(storage, allow_write=True)

    def writer(worker: int) -> None:
        async def write_all() -> None:
            for index in range(10):
                await agent.call_tool("set_value", key=f"w{worker}-{index}", value=index)

        asyncio.run(write_all())

    threads = [threading.Thread(target=writer, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(storage.get("values")) == 40
