"""database_tools() and SQLiteDatabase against real SQLite files."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from protolink import Agent, AgentCard, CapabilityPolicy, RunContext
from protolink.errors import BudgetExceededError, ToolArgumentError, ToolExecutionError
from protolink.tools import DatabaseBackend, SQLiteDatabase, database_tools
from tests.held_loop import DEADLINE_SECONDS, hold_up

ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "application.sqlite"
    with sqlite3.connect(path) as connection:
        connection.executescript(
            """
            CREATE TABLE items (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
                                category TEXT DEFAULT 'misc', data BLOB);
            CREATE TABLE owners (id INTEGER PRIMARY KEY, name TEXT);
            CREATE VIEW named_items AS SELECT id, name FROM items;
            CREATE INDEX items_by_name ON items (name);
            """
        )
        connection.executemany(
            "INSERT INTO items (name, category, data) VALUES (?, ?, ?)",
            [("anvil", "example", b"\x00\x01\xff"), ("bolt", "example", None), ("cog", "other", None)],
        )
        connection.execute("INSERT INTO owners VALUES (1, 'Ada')")
    connection.close()
    return path


def make_agent(backend: Any, **options: Any) -> Agent:
    agent = Agent(AgentCard(name="analyst"))
    for tool in database_tools(backend, **options):
        agent.add_tool(tool)
    return agent


def fingerprint(path: Path) -> tuple[str, list[str]]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), sorted(os.listdir(path.parent))


def descriptors_on(path: Path) -> int:
    fds = Path("/proc/self/fd")
    count = 0
    for name in os.listdir(fds):
        with contextlib.suppress(OSError):  # a descriptor closed while listing
            count += os.readlink(fds / name).startswith(str(path))
    return count


# -- the tools --------------------------------------------------------------------------------


def test_both_tools_require_database_read(db_path):
    tools = database_tools(SQLiteDatabase(db_path))
    assert {tool.name: tool.capabilities for tool in tools} == {
        "database_schema": ("database.read",), "query_database": ("database.read",)}


async def test_positional_and_named_parameters(db_path):
    agent = make_agent(SQLiteDatabase(db_path))
    positional = await agent.call_tool("query_database",
                                       sql="SELECT id, name FROM items WHERE category = ? ORDER BY id",
                                       parameters=["example"], max_rows=100)
    assert positional == {"columns": ["id", "name"], "rows": [[1, "anvil"], [2, "bolt"]], "truncated": False}
    named = await agent.call_tool("query_database",
                                  sql="SELECT :flag, :nothing, :ratio, name FROM items WHERE id = :id",
                                  parameters={"id": 3, "flag": True, "nothing": None, "ratio": 0.5})
    assert named["rows"] == [[1, None, 0.5, "cog"]]


async def test_sql_and_parameters_appear_in_the_preview(db_path):
    seen = []

    async def approve(request, run):
        seen.append(request.action.to_dict())
        return True

    agent = Agent(AgentCard(name="analyst"), policy=CapabilityPolicy({"database.read": "require_approval"}),
                  approval_handler=approve)
    for tool in database_tools(SQLiteDatabase(db_path)):
        agent.add_tool(tool)
    await agent.call_tool("query_database", sql="SELECT name FROM items WHERE id = ?", parameters=[2], max_rows=5)
    action = seen[0]
    assert action["capabilities"] == ["database.read"]
    assert action["arguments"] == {"sql": "SELECT name FROM items WHERE id = ?", "parameters": [2], "max_rows": 5}
    assert action["artifacts"][0]["content"] == {"sql": "SELECT name FROM items WHERE id = ?", "parameters": [2],
                                                 "max_rows": 5}


async def test_duplicate_column_names_are_kept_and_blobs_are_base64(db_path):
    agent = make_agent(SQLiteDatabase(db_path))
    result = await agent.call_tool("query_database",
                                   sql="SELECT i.id, o.id, i.data, i.name AS id FROM items i, owners o WHERE i.id = 1")
    assert result["columns"] == ["id", "id", "data", "id"]
    assert result["rows"] == [[1, 1, {"base64": base64.b64encode(b"\x00\x01\xff").decode()}, "anvil"]]


async def test_max_rows_truncates_and_an_exact_fit_does_not(db_path):
    agent = make_agent(SQLiteDatabase(db_path))
    cut = await agent.call_tool("query_database", sql="SELECT id FROM items ORDER BY id", max_rows=2)
    assert cut == {"columns": ["id"], "rows": [[1], [2]], "truncated": True}
    exact = await agent.call_tool("query_database", sql="SELECT id FROM items ORDER BY id", max_rows=3)
    assert exact["truncated"] is False


@pytest.mark.parametrize("arguments", [
    {"max_rows": 0}, {"max_rows": 1001}, {"sql": ""}, {"sql": "   "},
    {"parameters": [float("nan")]}, {"parameters": [[1]]}, {"parameters": {"a": {"b": 1}}},
])
async def test_arguments_are_validated(db_path, arguments):
    call = {"sql": "SELECT 1", **arguments}
    with pytest.raises(ToolArgumentError):
        await make_agent(SQLiteDatabase(db_path)).call_tool("query_database", **call)


async def test_max_rows_accepts_1000(db_path):
    result = await make_agent(SQLiteDatabase(db_path)).call_tool(
        "query_database", sql="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1500) "
                              "SELECT x FROM c", max_rows=1000)
    assert len(result["rows"]) == 1000
    assert result["truncated"] is True


@pytest.mark.parametrize("sql, parameters, message", [
    ("SELECT * FROM missing", None, "no such table"),
    ("SELEC 1", None, "syntax error"),
    ("SELECT 1; SELECT 2", None, "one statement"),
    ("SELECT ?", [1, 2], "bindings"),
    ("SELECT :a", {"b": 1}, "binding"),
    ("SELECT ?", [2**64], "too large|overflow|int"),
])
async def test_bad_queries_fail_with_value_error(db_path, sql, parameters, message):
    with pytest.raises(ValueError, match=message):
        await make_agent(SQLiteDatabase(db_path)).call_tool("query_database", sql=sql, parameters=parameters)


# -- read-only enforcement --------------------------------------------------------------------


@pytest.mark.parametrize("sql, denied", [
    ("INSERT INTO items (name) VALUES ('x')", "INSERT"),
    ("UPDATE items SET name = 'x'", "UPDATE"),
    ("DELETE FROM items", "DELETE"),
    ("REPLACE INTO owners VALUES (1, 'x')", "INSERT"),
    ("CREATE TABLE t (x)", "schema change|CREATE|DROP|ALTER"),
    ("CREATE TEMP TABLE t (x)", "schema change|CREATE|DROP|ALTER"),
    ("CREATE INDEX i ON items (name)", "schema change|CREATE|DROP|ALTER"),
    ("CREATE VIEW v AS SELECT 1", "schema change|CREATE|DROP|ALTER"),
    ("CREATE TRIGGER tr AFTER INSERT ON items BEGIN SELECT 1; END", "schema change|CREATE|DROP|ALTER"),
    ("DROP TABLE owners", "schema change|CREATE|DROP|ALTER"),
    ("DROP VIEW named_items", "schema change|CREATE|DROP|ALTER"),
    ("ALTER TABLE items ADD COLUMN extra TEXT", "schema change|CREATE|DROP|ALTER"),
    ("ATTACH DATABASE 'other.db' AS other", "ATTACH"),
    ("DETACH DATABASE main", "DETACH"),
    ("PRAGMA journal_mode = DELETE", "PRAGMA"),
    ("PRAGMA table_info(items)", "PRAGMA"),
    ("PRAGMA query_only = OFF", "PRAGMA"),
    ("SELECT * FROM pragma_table_info('items')", "PRAGMA"),
    ("SELECT value FROM json_each('[1]'), pragma_table_list", "PRAGMA"),
    ("BEGIN", "TRANSACTION"),
    ("BEGIN IMMEDIATE", "TRANSACTION"),
    ("COMMIT", "TRANSACTION"),
    ("ROLLBACK", "TRANSACTION"),
    ("SAVEPOINT s", "SAVEPOINT"),
    ("RELEASE s", "SAVEPOINT"),
    ("SELECT load_extension('/lib/x86_64-linux-gnu/libc.so.6')", "load_extension"),
    ("VACUUM", ""),
    ("ANALYZE", "ANALYZE"),
    ("REINDEX", ""),
    ("REINDEX items_by_name", "REINDEX"),
    ("DROP INDEX items_by_name", "schema change|CREATE|DROP|ALTER"),
    ("CREATE VIRTUAL TABLE v USING fts5(x)", "schema change|CREATE|DROP|ALTER"),
    ("CREATE VIRTUAL TABLE v USING json_each", "schema change|CREATE|DROP|ALTER"),
    ("CREATE VIRTUAL TABLE temp.v USING json_tree", "schema change|CREATE|DROP|ALTER"),
])
async def test_the_authorizer_rejects_every_non_read(db_path, sql, denied):
    before = fingerprint(db_path)
    with pytest.raises(ValueError, match=f"query rejected: .*({denied}).*read-only"):
        await make_agent(SQLiteDatabase(db_path)).call_tool("query_database", sql=sql)
    assert fingerprint(db_path) == before


async def test_json_table_valued_functions_read_on_a_fresh_connection(db_path):
    before = fingerprint(db_path)
    agent = make_agent(SQLiteDatabase(db_path))
    each = await agent.call_tool("query_database", sql="SELECT value FROM json_each('[1,2]')")
    assert each["rows"] == [[1], [2]]
    chosen = await agent.call_tool(
        "query_database", sql="SELECT id, name FROM items WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id",
        parameters=["[1,3]"])
    assert chosen["rows"] == [[1, "anvil"], [3, "cog"]]
    tree = await agent.call_tool("query_database", sql="""SELECT key FROM json_tree('{"a":1}') ORDER BY id""")
    assert tree["rows"] == [[None], ["a"]]
    assert fingerprint(db_path) == before


async def test_other_table_valued_functions_are_not_called_a_schema_change(db_path):
    with pytest.raises(ValueError, match="query rejected") as rejected:
        await make_agent(SQLiteDatabase(db_path)).call_tool("query_database",
                                                            sql="SELECT name FROM pragma_table_info('items')")
    assert "schema change" not in str(rejected.value)
    assert "pragma_* functions are PRAGMA" in str(rejected.value)


async def test_vacuum_into_cannot_write_a_file(db_path):
    target = db_path.parent / "copy.db"
    with pytest.raises(ValueError, match="ATTACH"):
        await make_agent(SQLiteDatabase(db_path)).call_tool("query_database", sql=f"VACUUM INTO '{target}'")
    assert not target.exists()


async def test_each_call_uses_a_fresh_connection_that_sees_new_data(db_path):
    agent = make_agent(SQLiteDatabase(db_path))
    assert (await agent.call_tool("query_database", sql="SELECT count(*) FROM owners"))["rows"] == [[1]]
    with sqlite3.connect(db_path) as writer:
        writer.execute("INSERT INTO owners VALUES (2, 'Bob')")
    writer.close()
    assert (await agent.call_tool("query_database", sql="SELECT count(*) FROM owners"))["rows"] == [[2]]
    assert descriptors_on(db_path) == 0


# -- the database file ------------------------------------------------------------------------


def test_only_an_existing_file_is_accepted(tmp_path, db_path):
    missing = tmp_path / "missing.sqlite"
    with pytest.raises(FileNotFoundError):
        SQLiteDatabase(missing)
    assert not missing.exists(), "a database is never created"
    for path in (":memory:", "", "file:x?mode=memory&cache=shared"):
        with pytest.raises(ValueError, match="in-memory"):
            SQLiteDatabase(path)
    with pytest.raises(ValueError, match="regular file"):
        SQLiteDatabase(tmp_path)


async def test_a_file_removed_later_is_not_recreated(tmp_path, db_path):
    database = SQLiteDatabase(db_path)
    db_path.unlink()
    with pytest.raises(RuntimeError, match="cannot open"):
        await make_agent(database).call_tool("query_database", sql="SELECT 1")
    assert not db_path.exists()


async def test_a_file_that_is_not_a_database_fails_clearly(tmp_path, db_path):
    path = tmp_path / "notes.sqlite"
    path.write_text("just text, not a database " * 100)
    with pytest.raises(ValueError, match="not a SQLite database"):
        SQLiteDatabase(path)
    database = SQLiteDatabase(db_path)
    db_path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    with pytest.raises(RuntimeError, match="failed: .*(malformed|not a database)"):
        await make_agent(database).call_tool("database_schema")


async def test_invalid_utf8_text_is_replaced_not_fatal(db_path):
    with sqlite3.connect(db_path) as writer:
        writer.execute("INSERT INTO owners VALUES (3, CAST(x'66ff6f' AS TEXT))")
    writer.close()
    result = await make_agent(SQLiteDatabase(db_path)).call_tool("query_database",
                                                                 sql="SELECT name FROM owners WHERE id = 3")
    assert result["rows"] == [["f\ufffdo"]]


# -- output caps ------------------------------------------------------------------------------


async def test_an_oversized_single_value_fails_before_transfer(db_path):
    agent = make_agent(SQLiteDatabase(db_path, max_result_bytes=1000))
    with pytest.raises(ValueError, match="exceeds max_result_bytes"):
        await agent.call_tool("query_database", sql="SELECT randomblob(5000)")
    with pytest.raises(ValueError, match="exceeds max_result_bytes"):
        await agent.call_tool("query_database", sql="SELECT 1, CAST(zeroblob(2000) AS TEXT)")


async def test_values_too_large_to_transfer_can_still_be_measured_and_filtered(db_path):
    with sqlite3.connect(db_path) as writer:
        writer.execute("INSERT INTO owners VALUES (9, ?)", ["x" * 299 + "!"])
    writer.close()
    agent = make_agent(SQLiteDatabase(db_path, max_result_bytes=200))
    result = await agent.call_tool("query_database", sql="SELECT id, length(name), substr(name, -3) FROM owners "
                                                         "WHERE name LIKE '%!' AND length(randomblob(5000)) = 5000")
    assert result["rows"] == [[9, 300, "xx!"]]
    with pytest.raises(ValueError, match="exceeds max_result_bytes"):
        await agent.call_tool("query_database", sql="SELECT name FROM owners WHERE id = 9")


@pytest.mark.parametrize("max_result_bytes, length", [(200, 300), (200, 1_000_000), (1_048_576, 2_000_000)])
async def test_a_generated_value_over_the_cap_fails_instead_of_becoming_null(db_path, max_result_bytes, length):
    agent = make_agent(SQLiteDatabase(db_path, max_result_bytes=max_result_bytes))
    with pytest.raises(ValueError, match="exceeds max_result_bytes"):
        await agent.call_tool("query_database", sql="SELECT printf('%.*c', ?, 'x')", parameters=[length])


@pytest.mark.parametrize("sql", ["SELECT zeroblob(1000000000)", "SELECT length(randomblob(1000000000))",
                                 "SELECT length(zeroblob(2000000000))"])
async def test_huge_values_inside_a_query_fail_at_the_length_limit(db_path, sql):
    with pytest.raises(ValueError, match="exceeds SQLite's length limit"):
        await make_agent(SQLiteDatabase(db_path)).call_tool("query_database", sql=sql)


async def test_rows_stop_at_the_json_byte_cap(db_path):
    agent = make_agent(SQLiteDatabase(db_path, max_result_bytes=1000))
    result = await agent.call_tool(
        "query_database", sql="WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 500) "
                              "SELECT x, 'row number ' || x FROM c", max_rows=1000)
    assert 10 < len(result["rows"]) < 500
    assert result["truncated"] is True
    assert len(json.dumps(result, separators=(",", ":"))) <= 1000


async def test_a_first_row_over_the_cap_gives_an_empty_truncated_result(db_path):
    agent = make_agent(SQLiteDatabase(db_path, max_result_bytes=1000))
    result = await agent.call_tool("query_database", sql="SELECT printf('%.600c', 'a'), printf('%.600c', 'b')")
    assert result == {"columns": [result["columns"][0], result["columns"][1]], "rows": [], "truncated": True}


# -- schema -----------------------------------------------------------------------------------


async def test_schema_lists_tables_views_and_columns(db_path):
    schema = await make_agent(SQLiteDatabase(db_path)).call_tool("database_schema")
    assert [(table["name"], table["type"]) for table in schema["tables"]] == [
        ("items", "table"), ("named_items", "view"), ("owners", "table")], "sqlite_sequence stays hidden"
    items = schema["tables"][0]["columns"]
    assert items == [
        {"name": "id", "type": "INTEGER", "not_null": False, "default": None, "primary_key": True},
        {"name": "name", "type": "TEXT", "not_null": True, "default": None, "primary_key": False},
        {"name": "category", "type": "TEXT", "not_null": False, "default": "'misc'", "primary_key": False},
        {"name": "data", "type": "BLOB", "not_null": False, "default": None, "primary_key": False},
    ]
    assert [column["name"] for column in schema["tables"][1]["columns"]] == ["id", "name"]
    assert schema["truncated"] is False


async def test_schema_is_limited_by_max_tables(db_path):
    schema = await make_agent(SQLiteDatabase(db_path, max_tables=2)).call_tool("database_schema")
    assert [table["name"] for table in schema["tables"]] == ["items", "named_items"]
    assert schema["truncated"] is True


async def test_schema_reports_a_broken_view_instead_of_failing(db_path):
    with sqlite3.connect(db_path) as writer:
        writer.execute("CREATE VIEW stale AS SELECT * FROM owners")
        writer.execute("DROP TABLE owners")
    writer.close()
    schema = await make_agent(SQLiteDatabase(db_path)).call_tool("database_schema")
    stale = next(table for table in schema["tables"] if table["name"] == "stale")
    assert stale["columns"] == [] and "no such table" in stale["error"]


# -- deadlines and cancellation ---------------------------------------------------------------


async def test_the_progress_deadline_stops_a_runaway_query(db_path):
    agent = make_agent(SQLiteDatabase(db_path, timeout_seconds=0.2))
    with pytest.raises(TimeoutError, match="0.2-second deadline"):
        await agent.call_tool("query_database", sql=ENDLESS)
    assert descriptors_on(db_path) == 0
    assert (await agent.call_tool("query_database", sql="SELECT 1"))["rows"] == [[1]]


async def test_the_tool_timeout_cancels_and_interrupts_the_query(db_path):
    agent = make_agent(SQLiteDatabase(db_path, timeout_seconds=600), timeout_seconds=0.2)
    async with asyncio.timeout(60):  # only a guard against a hang: the worker must stop
        with pytest.raises(TimeoutError, match="did not finish within 0.2 seconds"):
            await agent.call_tool("query_database", sql=ENDLESS)
    assert descriptors_on(db_path) == 0, "the worker's connection was interrupted and closed"


async def test_cancellation_interrupts_the_workers_connection(db_path):
    agent = make_agent(SQLiteDatabase(db_path, timeout_seconds=600))
    call = asyncio.create_task(agent.call_tool("query_database", sql=ENDLESS))
    while descriptors_on(db_path) == 0:
        await asyncio.sleep(0.01)
    call.cancel()
    async with asyncio.timeout(60):
        with pytest.raises(asyncio.CancelledError):
            await call
    assert descriptors_on(db_path) == 0
    assert (await agent.call_tool("query_database", sql="SELECT 2"))["rows"] == [[2]]


async def test_the_run_budget_bounds_the_query(db_path):
    agent = make_agent(SQLiteDatabase(db_path, timeout_seconds=600))
    with pytest.raises(BudgetExceededError):
        await agent.call_tool("query_database", sql=ENDLESS, context=RunContext(max_seconds=0.3))
    assert descriptors_on(db_path) == 0


async def test_an_answer_that_came_while_the_loop_was_held_past_the_deadline_is_returned():
    """A blocking step of the caller's held its loop past the call's deadline while the backend's
    worker thread answered: the answer waits unread behind the deadline's own callback, and the
    call returns it instead of failing as one that did not finish in time."""

    class AnsweredWhileHeld(ListBackend):
        """An adapter over a blocking driver, which answers from a worker thread."""

        async def query(self, *, sql: str, parameters: Any, max_rows: int) -> dict[str, Any]:
            held = hold_up(asyncio.get_running_loop())
            answer = {"columns": ["x"], "rows": [[1]], "truncated": False}
            return await asyncio.to_thread(lambda: held.wait(30) and answer)

    agent = make_agent(AnsweredWhileHeld(), timeout_seconds=DEADLINE_SECONDS)
    assert (await agent.call_tool("query_database", sql="SELECT x FROM t"))["rows"] == [[1]]


async def test_a_query_that_never_finishes_times_out_when_the_loop_was_held_past_the_deadline(db_path):
    """The time a held-up loop adds is bounded: a query that never finishes still fails the call
    as a timeout, with the tool's error, and is interrupted."""
    class Held(SQLiteDatabase):
        async def query(self, **arguments: Any) -> dict[str, Any]:
            hold_up(asyncio.get_running_loop())
            return await super().query(**arguments)

    agent = make_agent(Held(db_path, timeout_seconds=600), timeout_seconds=DEADLINE_SECONDS)
    async with asyncio.timeout(60):  # only a guard against a hang: the worker must stop
        with pytest.raises(TimeoutError, match=f"did not finish within {DEADLINE_SECONDS:g} seconds"):
            await agent.call_tool("query_database", sql=ENDLESS)
    assert descriptors_on(db_path) == 0, "the worker's connection was interrupted and closed"


# -- other backends ---------------------------------------------------------------------------


class ListBackend:
    """An application adapter that answers from memory."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def describe_schema(self) -> dict[str, Any]:
        return {"tables": [{"name": "t", "type": "table", "columns": []}], "truncated": False}

    async def query(self, *, sql: str, parameters: Any, max_rows: int) -> dict[str, Any]:
        self.calls.append({"sql": sql, "parameters": parameters, "max_rows": max_rows})
        return {"columns": ["x"], "rows": [[1]], "truncated": False}


async def test_an_application_backend_receives_the_exact_call():
    backend = ListBackend()
    assert isinstance(backend, DatabaseBackend)
    agent = make_agent(backend)
    assert (await agent.call_tool("database_schema"))["tables"][0]["name"] == "t"
    await agent.call_tool("query_database", sql="SELECT x FROM t WHERE y = :y", parameters={"y": "z"}, max_rows=7)
    assert backend.calls == [{"sql": "SELECT x FROM t WHERE y = :y", "parameters": {"y": "z"}, "max_rows": 7}]


async def test_a_backend_returning_something_else_is_an_execution_error():
    class Broken(ListBackend):
        async def describe_schema(self) -> Any:
            return ["not", "a", "dict"]

    with pytest.raises(ToolExecutionError, match="expected a JSON-compatible dictionary"):
        await make_agent(Broken()).call_tool("database_schema")


def test_the_factory_checks_its_backend_and_timeout(db_path):
    with pytest.raises(TypeError):
        database_tools(object())
    with pytest.raises(ValueError):
        database_tools(SQLiteDatabase(db_path), timeout_seconds=0)
