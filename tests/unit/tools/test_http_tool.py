"""http_tool(): a fixed API root, model-chosen paths below it, against a real HTTP server.

The server is Python's http.server on 127.0.0.1 in a thread (hence ``allow_http=True``); it
records every request and notices when a client goes away, and can hold the client's event loop
up before it answers.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from protolink import Agent, AgentCard, ApprovalDecision, CapabilityPolicy
from protolink.core.runs import RunContext
from protolink.errors import (
    ApprovalDeniedError,
    BudgetExceededError,
    DirectCallError,
    PolicyDeniedError,
    ToolArgumentError,
)
from protolink.tools import http_tool
from tests.descriptors import open_tcp_sockets
from tests.held_loop import DEADLINE_SECONDS, hold_up


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.received.append(Received(self.command, self.path, dict(self.headers), body))
        self.server.arrived.set()
        if self.server.hold is not None:  # a blocking step of the client's, before the answer
            assert hold_up(self.server.hold).wait(30)
        route = self.path.split("?", 1)[0]
        if route == "/v1/slow":
            while self.connection.recv(1):  # until the client closes the connection
                pass
            self.server.disconnected.set()
            self.close_connection = True
            return
        if route == "/v1/drop":
            self.close_connection = True
            return
        status, headers, payload = self._route(route, body)
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _route(self, route: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        json_type = [("Content-Type", "application/json")]
        if route == "/v1/items":
            return 200, [*json_type, ("ETag", '"v1"'), ("X-Internal-Secret", "hidden")], b'{"items": [1, 2]}'
        if route == "/v1/echo":
            echo = {"method": self.command, "path": self.path, "headers": dict(self.headers),
                    "body": body.decode()}
            return 200, json_type, json.dumps(echo).encode()
        if route == "/v1/text":
            return 200, [("Content-Type", "text/plain; charset=utf-8")], "héllo".encode()
        if route == "/v1/binary":
            return 200, [("Content-Type", "application/octet-stream")], b"\x00\xffbinary"
        if route == "/v1/redirect":
            return 302, [("Location", "/v1/items")], b""
        if route == "/v1/big":
            return 200, [("Content-Type", "text/plain")], b"b" * 2000
        if route == "/v1/gzip":
            return 200, [("Content-Type", "text/plain"), ("Content-Encoding", "gzip")], gzip.compress(b"z" * 5000)
        return 404, json_type, b'{"error": "not found"}'

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _handle

    def finish(self) -> None:  # runs when the client's keep-alive connection ends
        super().finish()
        self.server.finished.set()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[Received] = []
        self.arrived = threading.Event()
        self.disconnected = threading.Event()
        self.finished = threading.Event()
        self.hold: asyncio.AbstractEventLoop | None = None  # held up once a request has arrived

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/"


@pytest.fixture
def server() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=30)


def make_agent(*tools, policy: CapabilityPolicy | None = None, approval_handler=None) -> Agent:
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"), policy=policy,
                  approval_handler=approval_handler)
    for tool in tools:
        agent.add_tool(tool)
    return agent


async def wait_for(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 30)


# -- requests and responses --------------------------------------------------------------------


async def test_a_get_returns_status_selected_headers_and_json(server):
    agent = make_agent(http_tool(server.base, allow_http=True))

    result = await agent.call_tool("http_request", path="items", query={"limit": "10"})

    assert result == {
        "status_code": 200,
        "headers": {"content-type": "application/json", "etag": '"v1"'},
        "body": {"items": [1, 2]},
        "body_encoding": "json",
    }
    assert server.received[0].path == "/v1/items?limit=10"


async def test_the_client_is_closed_when_the_call_completes(server):
    agent = make_agent(http_tool(server.base, allow_http=True))

    await agent.call_tool("http_request", path="items")

    await wait_for(server.finished)  # HTTP/1.1 keep-alive would hold it open otherwise


async def test_relative_and_rooted_paths_address_the_same_resource_and_appear_in_previews(server):
    agent = make_agent(http_tool(server.base, allow_http=True))
    previews = []
    agent.events.add_sink(lambda e: previews.append(e.data["action"]["artifacts"][0]["content"])
                          if e.type == "action.requested" else None)

    await agent.call_tool("http_request", path="items")
    await agent.call_tool("http_request", path="/items", query={"q": "a b&c"})

    assert [r.path for r in server.received] == ["/v1/items", "/v1/items?q=a+b%26c"]
    assert previews[1] == {"method": "GET", "url": server.base + "items?q=a+b%26c", "path": "items",
                           "query": {"q": "a b&c"}, "body": None}


@pytest.mark.parametrize(
    "path",
    [
        "https://evil.example/v1/items",
        "//evil.example/items",
        "http:items",
        "../admin",
        "items/../../admin",
        "./items",
        "%2e%2e/admin",
        "%2E%2E%2Fadmin",
        "items%2F..%2F..%2Fadmin",
        "%252e%252e/admin",
        "items\\..\\admin",
        "items?admin=1",
        "items#fragment",
        "items%3Fadmin=1",
        "items%23x",
        "items//x",
        "items/%00",
        "items name",
        "items/%zz",
        "items/%ff",
    ],
)
async def test_paths_escaping_the_base_are_refused_before_any_request(server, path):
    agent = make_agent(http_tool(server.base, allow_http=True))

    with pytest.raises(ValueError):
        await agent.call_tool("http_request", path=path)

    assert server.received == []


async def test_encoded_ordinary_characters_are_kept(server):
    agent = make_agent(http_tool(server.base, allow_http=True))

    await agent.call_tool("http_request", path="items/caf%C3%A9 ".strip() + "/a%20b")
    await agent.call_tool("http_request", path="résumé")

    assert [r.path for r in server.received] == ["/v1/items/caf%C3%A9/a%20b", "/v1/r%C3%A9sum%C3%A9"]


async def test_redirects_and_errors_are_returned_not_followed(server):
    agent = make_agent(http_tool(server.base, allow_http=True))

    redirect = await agent.call_tool("http_request", path="redirect")
    missing = await agent.call_tool("http_request", path="missing")

    assert (redirect["status_code"], redirect["headers"]["location"]) == (302, "/v1/items")
    assert missing == {"status_code": 404, "headers": {"content-type": "application/json"},
                       "body": {"error": "not found"}, "body_encoding": "json"}
    assert [r.path for r in server.received] == ["/v1/redirect", "/v1/missing"]


async def test_text_binary_and_head_bodies(server):
    agent = make_agent(http_tool(server.base, allow_http=True))

    text = await agent.call_tool("http_request", path="text")
    binary = await agent.call_tool("http_request", path="binary")
    head = await agent.call_tool("http_request", path="items", method="HEAD")

    assert (text["body"], text["body_encoding"]) == ("héllo", "text")
    assert (binary["body"], binary["body_encoding"]) == ("AP9iaW5hcnk=", "base64")
    assert (head["status_code"], head["body"], head["body_encoding"]) == (200, "", "text")


async def test_response_limits_apply_to_decoded_bytes(server):
    agent = make_agent(http_tool(server.base, allow_http=True, max_response_bytes=1999, name="small"),
                       http_tool(server.base, allow_http=True, max_response_bytes=4999, name="gz"),
                       http_tool(server.base, allow_http=True, max_response_bytes=5000, name="gz_ok"))

    with pytest.raises(RuntimeError, match="max_response_bytes=1999"):
        await agent.call_tool("small", path="big")
    with pytest.raises(RuntimeError, match="max_response_bytes=4999"):
        await agent.call_tool("gz", path="gzip")  # about 40 bytes on the wire, 5000 decoded
    assert (await agent.call_tool("gz_ok", path="gzip"))["body"] == "z" * 5000


# -- methods, bodies and capabilities ----------------------------------------------------------


async def test_get_and_head_reject_bodies_and_unlisted_methods(server):
    agent = make_agent(http_tool(server.base, allow_http=True))

    with pytest.raises(ValueError, match="cannot have a body"):
        await agent.call_tool("http_request", path="echo", body={"x": 1})
    with pytest.raises(ToolArgumentError, match="method"):
        await agent.call_tool("http_request", path="echo", method="POST", body={"x": 1})
    assert server.received == []


async def test_writes_need_network_write_and_show_the_exact_body_for_approval(server):
    approvals = []

    async def approve(request, run):
        approvals.append(request)
        return ApprovalDecision(approved=request.action.arguments["body"] != {"delete": "all"},
                                request_id=request.request_id)

    policy = CapabilityPolicy({"network.read": "allow", "network.write": "require_approval"}, default_effect="deny")
    agent = make_agent(http_tool(server.base, allow_http=True, allowed_methods=["GET", "POST"]),
                       policy=policy, approval_handler=approve)

    result = await agent.call_tool("http_request", path="echo", method="POST", body={"name": "ünïcode", "n": [1]})

    assert approvals[0].capabilities == ("network.write",)
    assert approvals[0].artifacts[0].content == {"method": "POST", "url": server.base + "echo", "path": "echo",
                                                 "query": {}, "body": {"name": "ünïcode", "n": [1]}}
    assert json.loads(result["body"]["body"]) == {"name": "ünïcode", "n": [1]}
    assert result["body"]["headers"]["Content-Type"] == "application/json"
    with pytest.raises(ApprovalDeniedError):
        await agent.call_tool("http_request", path="echo", method="POST", body={"delete": "all"})
    assert len(server.received) == 1
    await agent.call_tool("http_request", path="echo")  # reads stay allowed without approval
    assert len(approvals) == 2


async def test_the_request_size_is_bounded_before_sending(server):
    agent = make_agent(http_tool(server.base, allow_http=True, allowed_methods=["POST"], max_request_bytes=20))

    with pytest.raises(ValueError, match="max_request_bytes=20"):
        await agent.call_tool("http_request", path="echo", method="POST", body="x" * 30)
    assert server.received == []
    result = await agent.call_tool("http_request", path="echo", method="POST", body="x" * 10)
    assert result["status_code"] == 200


async def test_advertised_capabilities_and_direct_calls(server):
    reader = http_tool(server.base, allow_http=True)
    writer = http_tool(server.base, allow_http=True, allowed_methods=("GET", "DELETE"), name="writer")

    assert reader.capabilities == ("network.read",)
    assert writer.capabilities == ("network.read", "network.write")
    assert writer.input_schema["properties"]["method"]["enum"] == ["GET", "DELETE"]
    with pytest.raises(DirectCallError):
        await reader(path="items")
    agent = make_agent(writer, policy=CapabilityPolicy({"network.write": "deny"}))
    with pytest.raises(PolicyDeniedError):
        await agent.call_tool("writer", path="items", method="DELETE")
    assert server.received == []


# -- headers -----------------------------------------------------------------------------------


async def test_headers_are_copied_at_registration(server):
    headers = {"Authorization": "Bearer first"}
    agent = make_agent(http_tool(server.base, allow_http=True, headers=headers))
    headers["Authorization"] = "Bearer changed"

    await agent.call_tool("http_request", path="items")

    assert server.received[0].headers["Authorization"] == "Bearer first"


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_header_callbacks_are_resolved_per_request(server, kind):
    tokens = iter(["one", "two"])

    def sync_headers() -> dict[str, str]:
        return {"Authorization": f"Bearer {next(tokens)}"}

    async def async_headers() -> dict[str, str]:
        return sync_headers()

    agent = make_agent(http_tool(server.base, allow_http=True,
                                 headers=sync_headers if kind == "sync" else async_headers))
    await agent.call_tool("http_request", path="items")
    await agent.call_tool("http_request", path="items")

    assert [r.headers["Authorization"] for r in server.received] == ["Bearer one", "Bearer two"]


async def test_the_model_cannot_supply_headers(server):
    agent = make_agent(http_tool(server.base, allow_http=True))

    with pytest.raises(ToolArgumentError):
        await agent.call_tool("http_request", path="items", headers={"Host": "evil.example"})
    assert server.received == []


# -- transport behaviour -----------------------------------------------------------------------


async def test_ambient_proxy_settings_are_ignored(server, monkeypatch):
    for variable in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(variable, "http://127.0.0.1:9")  # nothing listens there
    for variable in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(variable, raising=False)
    agent = make_agent(http_tool(server.base, allow_http=True))

    assert (await agent.call_tool("http_request", path="items"))["status_code"] == 200


async def test_a_dropped_connection_fails_without_retrying(server):
    agent = make_agent(http_tool(server.base, allow_http=True, allowed_methods=["POST"]))

    with pytest.raises(RuntimeError, match="failed"):
        await agent.call_tool("http_request", path="drop", method="POST", body={"n": 1})
    assert len(server.received) == 1


# The client's own end of the connection is counted, not what the server saw: on a loaded machine
# 0.3 s can pass before the request is sent, and the server then never sees one arrive or end.
async def test_a_timeout_fails_and_closes_the_client(server):
    agent = make_agent(http_tool(server.base, allow_http=True, timeout_seconds=0.3))

    with pytest.raises(RuntimeError, match="timed out after 0.3 seconds"):
        await agent.call_tool("http_request", path="slow")
    assert open_tcp_sockets(server.server_address[1]) == 0


async def test_an_answer_that_came_while_the_loop_was_held_past_the_deadline_is_returned(server):
    """A blocking step of the caller's held its loop past the call's deadline while the server
    answered: the answer waits unread behind the deadline's own callback, and the call returns it
    instead of failing as one that timed out."""
    server.hold = asyncio.get_running_loop()
    agent = make_agent(http_tool(server.base, allow_http=True, timeout_seconds=DEADLINE_SECONDS))

    result = await agent.call_tool("http_request", path="items")

    assert (result["status_code"], result["body"]) == (200, {"items": [1, 2]})


async def test_a_server_that_never_answers_times_out_when_the_loop_was_held_past_the_deadline(server):
    """The time a held-up loop adds is bounded: a server that never answers still fails the call
    as a timeout, with the tool's error."""
    server.hold = asyncio.get_running_loop()
    agent = make_agent(http_tool(server.base, allow_http=True, timeout_seconds=DEADLINE_SECONDS))

    with pytest.raises(RuntimeError, match=f"timed out after {DEADLINE_SECONDS:g} seconds"):
        await agent.call_tool("http_request", path="slow")
    assert open_tcp_sockets(server.server_address[1]) == 0


async def test_the_run_budget_bounds_the_request(server):
    agent = make_agent(http_tool(server.base, allow_http=True))

    with pytest.raises(BudgetExceededError):
        await agent.call_tool("http_request", context=RunContext(max_seconds=0.3), path="slow")
    assert open_tcp_sockets(server.server_address[1]) == 0


async def test_cancellation_closes_the_client(server):
    agent = make_agent(http_tool(server.base, allow_http=True))
    call = asyncio.create_task(agent.call_tool("http_request", path="slow"))
    await wait_for(server.arrived)

    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await wait_for(server.disconnected)


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "options"),
    [
        ("http://api.example.com/v1/", {}),
        ("ftp://api.example.com/v1/", {"allow_http": True}),
        ("https://user:pw@api.example.com/v1/", {}),
        ("https://api.example.com/v1/?key=1", {}),
        ("https://api.example.com/v1/#top", {}),
        ("https:///v1/", {}),
        ("https://api.example.com:99999/", {}),
        ("https://api.example.com/", {"allowed_methods": ["GET", "TRACE"]}),
        ("https://api.example.com/", {"allowed_methods": []}),
        ("https://api.example.com/", {"name": "not a name"}),
        ("https://api.example.com/", {"timeout_seconds": 0}),
    ],
)
def test_invalid_configuration_is_refused_at_registration(base_url, options):
    with pytest.raises(ValueError):
        http_tool(base_url, **options)


def test_a_base_without_trailing_slash_still_scopes_paths():
    tool = http_tool("https://api.example.com/v1", name="application_api")

    assert tool.name == "application_api"
    assert "https://api.example.com/v1/" in tool.description


def test_only_http_tool_needs_the_integrations_extra():
    probe = """
import sys
sys.modules["httpx"] = None  # as if the integrations extra were not installed
from protolink.tools import ask_user_tool, calculator, current_datetime, fetch_url, web_search
for factory in (calculator, current_datetime, fetch_url, web_search):
    factory()
try:
    from protolink.tools import http_tool
except ImportError as error:
    print(error)
"""
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert "pip install 'protolink[integrations]'" in run.stdout
