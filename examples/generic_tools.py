"""Generic built-in tools on one ordinary Agent: files, JSON storage, HTTP, documents and SQLite.

Runs offline in a temporary directory, with a small JSON API served on 127.0.0.1::

    pip install 'protolink[integrations]'
    python examples/generic_tools.py

Reads are allowed; file writes, restorations, storage writes and HTTP writes require approval,
which this demonstration grants automatically while printing what it was asked to approve.
Recovery checkpoints and tool values live in SQLite outside the workspace root.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from protolink import Agent, AgentCard, ApprovalRequest, CapabilityPolicy, RunContext, StorageCheckpointStore
from protolink.storage import SQLiteStorage
from protolink.tools import (
    SQLiteDatabase,
    database_tools,
    document_tools,
    filesystem_tools,
    http_tool,
    storage_tools,
)


async def approve_and_show(request: ApprovalRequest, run: RunContext) -> bool:
    print(f"  approval for {request.action.tool}:")
    for artifact in request.artifacts:
        if artifact.kind == "diff":
            print("    " + artifact.content.rstrip().replace("\n", "\n    "))
        elif artifact.kind in ("storage_write", "http_request"):
            print(f"    {json.dumps(artifact.content)}")
        else:
            print(f"    {artifact.kind}: {artifact.title}")
    return True


def show(label: str, value: Any) -> None:
    print(f"{label}: {json.dumps(value, ensure_ascii=False)}")


async def filesystem_section(agent: Agent, workspace: Path) -> None:
    print("\n== files: read, search, edit, recover")
    notes = workspace / "notes.md"
    notes.write_text("# Notes\n\nShip the report on Friday.\n", encoding="utf-8")
    show("read_file", await agent.call_tool("read_file", path=str(notes)))
    found = await agent.call_tool("search_files", path=str(workspace), query="friday")
    show("search_files", found["items"])
    change = await agent.call_tool("edit_file", path=str(notes), old_text="Friday", new_text="Monday")
    print(f"edited: {notes.read_text(encoding='utf-8')!r}")
    preview = await agent.call_tool("preview_change", change_id=change["change_id"])
    print(f"recovery preview: state={preview['state']} conflict={preview['conflict']}")
    await agent.call_tool("restore_change", change_id=change["change_id"])
    print(f"restored: {notes.read_text(encoding='utf-8')!r}")


async def storage_section(agent: Agent) -> None:
    print("\n== storage: JSON values")
    await agent.call_tool("set_value", key="preferences", value={"units": "metric", "digest": True})
    await agent.call_tool("set_value", key="last_run", value=None)
    show("get_value", await agent.call_tool("get_value", key="preferences"))
    show("stored null", await agent.call_tool("get_value", key="last_run"))
    show("list_keys", await agent.call_tool("list_keys", prefix="", limit=10))
    show("delete_value", await agent.call_tool("delete_value", key="last_run"))
    show("missing", await agent.call_tool("get_value", key="last_run"))


class ItemsAPI(BaseHTTPRequestHandler):
    """A stand-in for an application's JSON API: GET /v1/items and POST /v1/items."""

    protocol_version = "HTTP/1.1"
    items = ["anvil", "bolt"]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def reply(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.headers.get("Authorization") == "Bearer demo-token":
            self.reply(200, {"items": self.items})
        else:
            self.reply(401, {"error": "unauthorized"})

    def do_POST(self) -> None:
        item = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["name"]
        self.items.append(item)
        self.reply(201, {"created": item})


async def http_section(agent: Agent) -> None:
    print("\n== http: a fixed API root")
    show("GET items", await agent.call_tool("application_api", path="items", query={"limit": "10"}))
    show("POST items", await agent.call_tool("application_api", path="/items", method="POST",
                                             body={"name": "cog"}))
    try:
        await agent.call_tool("application_api", path="../admin")
    except ValueError as error:
        print(f"a path outside the root is refused: {error}")


async def documents_section(agent: Agent, workspace: Path) -> None:
    print("\n== documents: CSV extraction and search")
    sales = workspace / "sales.csv"
    sales.write_text("region,quarter,revenue\nNorth,Q1,120\nSouth,Q1,95\nNorth,Q2,140\n", encoding="utf-8")
    document = await agent.call_tool("read_document", path=str(sales))
    show("metadata", document["metadata"])
    for section in document["sections"]:
        show(f"  row {section['location']['row']}", section["cells"])
    show("search 'north'", (await agent.call_tool("search_document", path=str(sales), query="north"))["matches"])


async def database_section(agent: Agent) -> None:
    print("\n== database: read-only SQLite")
    schema = await agent.call_tool("database_schema")
    show("tables", [(table["name"], [column["name"] for column in table["columns"]]) for table in schema["tables"]])
    rows = await agent.call_tool(
        "query_database",
        sql="SELECT id, name FROM items WHERE category = ? ORDER BY id",
        parameters=["example"],
        max_rows=100,
    )
    show("query_database", rows)
    try:
        await agent.call_tool("query_database", sql="DELETE FROM items")
    except ValueError as error:
        print(f"a write is refused: {error}")


def make_database(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, category TEXT)")
        connection.executemany("INSERT INTO items (name, category) VALUES (?, ?)",
                               [("anvil", "example"), ("bolt", "example"), ("cog", "other")])
    connection.close()


async def main() -> None:
    api = ThreadingHTTPServer(("127.0.0.1", 0), ItemsAPI)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as temporary:
        workspace = Path(temporary, "workspace").resolve()
        workspace.mkdir()
        database = Path(temporary, "application.sqlite")
        make_database(database)
        recovery = SQLiteStorage(Path(temporary, "application.db"), namespace="file-changes")
        values = SQLiteStorage(Path(temporary, "application.db"), namespace="tool-values")

        agent = Agent(
            AgentCard(name="generalist", description="files, values, documents and a database"),
            policy=CapabilityPolicy({
                "filesystem.write": "require_approval",
                "filesystem.restore": "require_approval",
                "storage.write": "require_approval",
                "network.write": "require_approval",
            }),
            approval_handler=approve_and_show,
        )
        for tool in (
            *filesystem_tools(roots=[workspace], checkpoints=StorageCheckpointStore(recovery)),
            *storage_tools(values, allow_write=True),
            *document_tools(roots=[workspace]),
            *database_tools(SQLiteDatabase(database)),
            http_tool(
                f"http://127.0.0.1:{api.server_address[1]}/v1/",
                headers=lambda: {"Authorization": "Bearer demo-token"},  # resolved per request
                allowed_methods=["GET", "POST"],
                allow_http=True,  # a deliberately selected local endpoint
                name="application_api",
            ),
        ):
            agent.add_tool(tool)
        print("tools:", ", ".join(agent.tools))

        await filesystem_section(agent, workspace)
        await storage_section(agent)
        await http_section(agent)
        await documents_section(agent, workspace)
        await database_section(agent)
        recovery.close()
        values.close()
    api.shutdown()
    api.server_close()


if __name__ == "__main__":
    asyncio.run(main())
