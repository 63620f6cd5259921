"""database_tools(): inspect a database's schema and run read-only queries.

The tools talk to a :class:`DatabaseBackend`: :class:`SQLiteDatabase` for an existing SQLite
file, or an application adapter that owns its credentials, connections, read-only enforcement,
limits and cancellation. The wrapper does not parse SQL; the exact SQL and parameters appear in
the approval preview.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol, runtime_checkable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool

from protolink import deadlines
from protolink.core.tools import (
    Artifact,
    Preparation,
    PreparedTool,
    ToolContext,
    jsonable,
)
from protolink.errors import ToolExecutionError

from ._budget import within_budget
from .sqlite_database import SQLiteDatabase

__all__ = ["DatabaseBackend", "SQLiteDatabase", "database_tools"]

CAPABILITY = "database.read"
TAGS = ("builtin", "database", "read-only")
MAX_SQL_CHARS = 100_000
MAX_PARAMETERS = 1_000
MAX_ROWS = 1_000


@runtime_checkable
class DatabaseBackend(Protocol):
    """A database the tools can read.

    ``describe_schema()`` returns ``{"tables": [...], "truncated": bool}``;
    ``query(sql=, parameters=, max_rows=)`` returns ``{"columns": [...], "rows": [[...]],
    "truncated": bool}``. Both return JSON-compatible dictionaries. ``parameters`` is None, a
    list for positional placeholders, or a mapping for named ones.
    """

    async def describe_schema(self) -> dict[str, Any]: ...

    async def query(
        self, *, sql: str, parameters: Sequence[Any] | Mapping[str, Any] | None, max_rows: int
    ) -> dict[str, Any]: ...


def _nonblank(sql: str) -> str:
    if not sql.strip():
        raise ValueError("sql must not be blank")
    return sql


Parameter = StrictBool | int | Annotated[float, Field(allow_inf_nan=False)] | str | None


class SchemaArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueryArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sql: Annotated[str, Field(min_length=1, max_length=MAX_SQL_CHARS,
                              description="One read-only SQL statement; use placeholders for values."),
                   AfterValidator(_nonblank)]
    parameters: (
        Annotated[list[Parameter], Field(max_length=MAX_PARAMETERS)]
        | Annotated[dict[str, Parameter], Field(max_length=MAX_PARAMETERS)]
        | None
    ) = Field(default=None, description="A list for positional (?) placeholders or an object for "
                                        "named (:name) ones: strings, numbers, booleans or null.")
    max_rows: int = Field(default=100, ge=1, le=MAX_ROWS, description=f"Maximum rows returned (1–{MAX_ROWS}).")


def database_tools(backend: DatabaseBackend, *, timeout_seconds: float = 30) -> list[PreparedTool]:
    """Create ``database_schema()`` and ``query_database(sql, parameters=None, max_rows=100)``.

    Both require ``database.read``. Each call waits at most ``timeout_seconds`` (cut to the
    run's remaining budget); on expiry or cancellation the backend call is canceled, which for
    :class:`SQLiteDatabase` interrupts its connection. Queries are not retried.
    """
    if not isinstance(backend, DatabaseBackend):
        raise TypeError(f"backend must implement DatabaseBackend, not {type(backend).__name__}")
    if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)) or not timeout_seconds > 0:
        raise ValueError(f"timeout_seconds must be a positive number, not {timeout_seconds!r}")

    async def call(ctx: ToolContext, operation: str, make: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
        result = await within_budget(ctx, timeout_seconds, operation,
                                     lambda timeout: _wait(make(), timeout, operation))
        if not isinstance(result, Mapping):
            raise ToolExecutionError(f"{operation}: the backend returned {type(result).__name__}, "
                                     "expected a JSON-compatible dictionary")
        return jsonable(result)

    async def prepare_schema(args: SchemaArguments, ctx: ToolContext) -> Preparation:
        async def execute(ctx: ToolContext) -> dict[str, Any]:
            return await call(ctx, "database_schema", backend.describe_schema)

        return Preparation(execute=execute, capabilities=(CAPABILITY,))

    async def prepare_query(args: QueryArguments, ctx: ToolContext) -> Preparation:
        preview = Artifact(kind="database_query", title="SQL query",
                           content={"sql": args.sql, "parameters": args.parameters, "max_rows": args.max_rows})

        async def execute(ctx: ToolContext) -> dict[str, Any]:
            return await call(ctx, "query_database", lambda: backend.query(
                sql=args.sql, parameters=args.parameters, max_rows=args.max_rows))

        return Preparation(execute=execute, capabilities=(CAPABILITY,), artifacts=(preview,))

    return [
        PreparedTool(
            name="database_schema",
            description="List the database's tables and views with their columns (truncated when cut).",
            arguments=SchemaArguments,
            prepare=prepare_schema,
            capabilities=(CAPABILITY,),
            tags=TAGS,
        ),
        PreparedTool(
            name="query_database",
            description=(
                "Run one read-only SQL query with bound parameters. Returns columns, positional "
                "rows and truncated; blobs are {\"base64\": ...}. Filter and order in SQL to "
                "narrow results. Writes, ATTACH, PRAGMA and transactions are rejected."
            ),
            arguments=QueryArguments,
            prepare=prepare_query,
            capabilities=(CAPABILITY,),
            tags=TAGS,
        ),
    ]


async def _wait(call: Awaitable[Any], timeout: float, operation: str) -> Any:
    """Await ``call``, canceling it after ``timeout``; the backend's own deadline errors pass."""
    deadline = deadlines.timeout(timeout)
    try:
        async with deadline:
            return await call
    except TimeoutError:
        if deadline.expired():
            raise TimeoutError(f"{operation} did not finish within {timeout:g} seconds") from None
        raise
