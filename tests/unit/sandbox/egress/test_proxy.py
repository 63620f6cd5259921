"""The egress proxy on real loopback sockets: what it allows, what it refuses, what it reports."""

from __future__ import annotations

import asyncio
import http.client
import time
import urllib.request

import pytest

from protolink.deadlines import LATE_SECONDS
from protolink.sandbox.egress import EgressLimits, EgressPolicy
from protolink.sandbox.egress.proxy import EgressProxy
from tests.descriptors import open_descriptors

from .support import LOOPBACK_RULES, Origin, ScriptedNetwork, accepting, serve, until_closed, wait_for

PUBLIC = "151.101.0.223"


@pytest.fixture
async def origin():
    async with Origin() as server:
        yield server


def status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer[9:12])


async def test_connect_to_an_allowed_name_tunnels_to_the_validated_address(origin):
    network = ScriptedNetwork(origin.port, {"files.example": [[PUBLIC]]})
    async with serve(EgressPolicy.parse(["files.example:443"]), network) as served:
        reader, writer = await served.open()
        writer.write(b"CONNECT files.example:443 HTTP/1.1\r\nHost: files.example:443\r\n\r\nearly bytes|")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection established\r\n\r\n"
        writer.write(b"more")
        assert await reader.readexactly(16) == b"early bytes|more"
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()
        await wait_for(lambda: "closed" in served.kinds())
    assert network.connections == [(PUBLIC, 443)] and network.lookups == ["files.example"]
    allowed, closed = served.events
    assert (allowed.kind, allowed.host, allowed.port, allowed.address, allowed.method) == (
        "allowed", "files.example", 443, PUBLIC, "CONNECT")
    assert (closed.kind, closed.reason, closed.bytes_up, closed.bytes_down) == ("closed", "eof", 16, 16)
    assert closed.duration_seconds > 0 and closed.sandbox == "test"


async def test_a_server_that_speaks_first_is_heard_after_the_answer():
    """An SSH or SMTP server greets as soon as it is connected: its greeting follows the 200."""
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-test\r\n")
        writer.write(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with serve(EgressPolicy.parse([f"127.0.0.1/32:{port}"], addresses=LOOPBACK_RULES)) as served:
            reader, writer = await served.open()
            writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection established\r\n\r\n"
            assert await reader.readuntil(b"\r\n") == b"SSH-2.0-test\r\n"
            writer.write(b"hello")
            assert await asyncio.wait_for(reader.read(), 30) == b"hello"
            writer.close()
    finally:
        server.close()


async def test_plain_http_through_the_system_network_with_loopback_opted_in(origin):
    policy = EgressPolicy.parse([f"localhost:{origin.port}", f"127.0.0.0/8:{origin.port}"], addresses=LOOPBACK_RULES)
    async with serve(policy) as served:
        answer = await served.ask(f"GET http://localhost:{origin.port}/bytes/5 HTTP/1.1\r\n"
                                  "Host: localhost\r\nProxy-Connection: keep-alive\r\n\r\n".encode())
        assert answer == b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nxxxxx"
        answer = await served.ask(f"GET http://2130706433:{origin.port}/bytes/3 HTTP/1.1\r\n\r\n".encode())
        assert answer.endswith(b"\r\n\r\nxxx")
        await wait_for(lambda: served.kinds().count("closed") == 2)
    assert origin.requests[0] == f"GET /bytes/5 HTTP/1.1\r\nHost: localhost:{origin.port}\r\nConnection: close\r\n\r\n".encode()
    assert [e.address for e in served.events if e.kind == "allowed"] == ["127.0.0.1", "127.0.0.1"]


async def test_a_request_body_is_forwarded_up_to_its_content_length(origin):
    network = ScriptedNetwork(origin.port, {"echo.example": [[PUBLIC]]})
    async with serve(EgressPolicy.parse(["echo.example"]), network) as served:
        reader, writer = await served.open()
        writer.write(b"POST http://echo.example/ HTTP/1.1\r\nContent-Length: 4\r\n\r\nbodyEXTRA")
        answer = await reader.readuntil(b"body")
        assert answer == b"POST / HTTP/1.1\r\nHost: echo.example\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody"
        writer.close()
    assert served.events[-1].bytes_up == len(answer)  # what followed the body was not sent


def refused(served, reason: str) -> None:
    denied = [e for e in served.events if e.kind == "denied"]
    assert denied and reason in denied[-1].reason, served.events
    assert "allowed" not in served.kinds()


@pytest.mark.parametrize(("head", "code", "reason"), [
    (b"CONNECT other.example:443 HTTP/1.1\r\n\r\n", 403, "other.example is not on the allow-list"),
    (b"CONNECT files.example:8443 HTTP/1.1\r\n\r\n", 403, "port 8443 is not allowed for files.example"),
    (b"CONNECT files.example.evil.example:443 HTTP/1.1\r\n\r\n", 403, "not on the allow-list"),
    (b"CONNECT 151.101.0.223:443 HTTP/1.1\r\n\r\n", 403, "IP literal 151.101.0.223 is not in any allowed network"),
    (b"CONNECT 2130706433:443 HTTP/1.1\r\n\r\n", 403, "IP literal 127.0.0.1"),
    (b"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", 403, "IP literal ::1"),
    (b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n", 403, "IP literal 169.254.169.254"),
    (b"CONNECT 10.1.2.3:443 HTTP/1.1\r\n\r\n", 403, "10.1.2.3 is private"),
    (b"CONNECT 012.1.2.3:443 HTTP/1.1\r\n\r\n", 403, "10.1.2.3 is private"),
    (b"CONNECT loopback.example:443 HTTP/1.1\r\n\r\n", 403, "resolves to a denied address: 127.0.0.1 is loopback"),
    (b"CONNECT private.example:443 HTTP/1.1\r\n\r\n", 403, "10.0.0.7 is private"),
    (b"CONNECT metadata.example:443 HTTP/1.1\r\n\r\n", 403, "169.254.169.254 is link-local (the cloud metadata"),
    (b"CONNECT mixed.example:443 HTTP/1.1\r\n\r\n", 403, "192.168.0.1 is private"),
    (b"CONNECT mapped.example:443 HTTP/1.1\r\n\r\n", 403, "embeds an IPv4 address: 127.0.0.1 is loopback"),
    (b"CONNECT missing.example:443 HTTP/1.1\r\n\r\n", 502, "could not resolve missing.example"),
    (b"CONNECT http://files.example:443 HTTP/1.1\r\nHost: files.example\r\n\r\n", 400, "authority"),
    (b"CONNECT files.example:443 HTTP/1.1\r\nHost: files.example:443\r\nHost: other.example:443\r\n\r\n", 400,
     "more than one Host"),
    (b"CONNECT files.example:443 HTTP/1.1\r\nHost: other.example:443\r\n\r\n", 400, "does not name"),
    (b"CONNECT files.example:443  HTTP/1.1\r\n\r\n", 400, "single spaces"),
    (b"CONNECT files.example:443 other.example:443 HTTP/1.1\r\n\r\n", 400, "single spaces"),
    (b"CONNECT files.example\x00.other.example:443 HTTP/1.1\r\n\r\n", 400, "malformed request line"),
    (b"GET /index.html HTTP/1.1\r\nHost: files.example\r\n\r\n", 400, "absolute http:// URL"),
    (b"GET https://files.example/ HTTP/1.1\r\n\r\n", 400, "use CONNECT for https"),
    (b"CONNECT files.example:443 HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 431, "larger than 16384 bytes"),
])
async def test_refusals_answer_and_report_the_reason(origin, head, code, reason):
    network = ScriptedNetwork(origin.port, {
        "files.example": [[PUBLIC]], "other.example": [[PUBLIC]], "loopback.example": [["127.0.0.1"]],
        "private.example": [["10.0.0.7"]], "metadata.example": [["169.254.169.254"]],
        "mixed.example": [[PUBLIC, "192.168.0.1"]], "mapped.example": [["::ffff:127.0.0.1"]],
        "files.example.evil.example": [[PUBLIC]], "files.example.": [[PUBLIC]],
    })
    policy = EgressPolicy.parse(["files.example:443", "loopback.example:443", "private.example:443",
                                 "metadata.example:443", "mixed.example:443", "mapped.example:443",
                                 "missing.example:443", "10.0.0.0/8:443"])
    async with serve(policy, network) as served:
        answer = await served.ask(head)
        assert status(answer) == code and reason.encode() in answer
        await wait_for(lambda: served.events)
        refused(served, reason)
    assert network.connections == []


async def test_rebinding_resolves_once_and_connects_to_the_validated_address(origin):
    network = ScriptedNetwork(origin.port, {"rebind.example": [[PUBLIC], ["127.0.0.1"]]})
    async with serve(EgressPolicy.parse(["rebind.example:443"]), network) as served:
        reader, writer = await served.open()
        writer.write(b"CONNECT rebind.example:443 HTTP/1.1\r\n\r\nping")
        await reader.readuntil(b"\r\n\r\n")
        assert await reader.readexactly(4) == b"ping"
        writer.close()
        # The next connection asks again, gets the private answer, and is refused.
        answer = await served.ask(b"CONNECT rebind.example:443 HTTP/1.1\r\n\r\n")
        assert status(answer) == 403 and b"127.0.0.1 is loopback" in answer
    assert network.lookups == ["rebind.example", "rebind.example"]
    assert network.connections == [(PUBLIC, 443)]


async def test_a_name_resolving_to_loopback_is_refused_by_default_even_with_the_system_resolver(origin):
    async with serve(EgressPolicy.parse([f"localhost:{origin.port}"])) as served:
        answer = await served.ask(f"GET http://localhost:{origin.port}/bytes/1 HTTP/1.1\r\n\r\n".encode())
        assert status(answer) == 403 and b"is loopback" in answer
    assert origin.requests == []


async def test_a_slow_client_that_never_finishes_its_request_line_is_dropped(origin):
    limits = EgressLimits(head_seconds=0.5)
    async with serve(EgressPolicy.parse(["files.example"], limits=limits)) as served:
        reader, writer = await served.open()
        writer.write(b"CONNECT files.exam")
        async with asyncio.timeout(10):
            answer = await reader.read()
        assert status(answer) == 408
        writer.close()
        refused(served, "not complete within 0.5 seconds")
        await wait_for(lambda: served.proxy.open_connections == 0)


async def test_an_event_handler_that_raises_does_not_break_the_proxy(origin):
    def explode(event):
        raise RuntimeError("handler bug")

    network = ScriptedNetwork(origin.port, {"files.example": [[PUBLIC]]})
    async with serve(EgressPolicy.parse(["files.example"]), network, on_event=explode) as served:
        answer = await served.ask(b"GET http://files.example/bytes/2 HTTP/1.1\r\n\r\n")
        assert answer.endswith(b"xx")
        assert status(await served.ask(b"GET http://other.example/ HTTP/1.1\r\n\r\n")) == 403


async def test_a_connect_failure_is_a_bad_gateway_and_a_closed_event(origin):
    policy = EgressPolicy.parse(["127.0.0.1:1"], addresses=LOOPBACK_RULES)
    async with serve(policy) as served:
        answer = await served.ask(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")
        assert status(answer) == 502
        await wait_for(lambda: "closed" in served.kinds())
    assert served.kinds() == ["allowed", "closed"] and served.events[1].reason.startswith("connect failed")


async def test_aclose_ends_open_tunnels_and_leaves_no_task(origin):
    network = ScriptedNetwork(origin.port, {"files.example": [[PUBLIC]]})
    before = len(asyncio.all_tasks())
    proxy = EgressProxy(EgressPolicy.parse(["files.example"]), sandbox="s", network=network)
    with accepting(proxy.handle) as port:
        clients = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"CONNECT files.example:443 HTTP/1.1\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            clients.append((reader, writer))
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)  # no request yet
        await wait_for(lambda: proxy.open_connections == 4)
        await proxy.aclose()
        assert proxy.open_connections == 0
        for reader, writer in [*clients, (idle_reader, idle_writer)]:
            await until_closed(reader)
            writer.close()
    await wait_for(lambda: len(asyncio.all_tasks()) <= before)


async def test_no_socket_is_left_open(origin):
    """Allowed, refused, budget-cut and policy-cut connections: file descriptors come back."""
    network = ScriptedNetwork(origin.port, {"files.example": [[PUBLIC]]})
    limits = EgressLimits(max_bytes=4 << 20)
    before = open_descriptors()
    async with serve(EgressPolicy.parse(["files.example"], limits=limits), network) as served:
        for head in (b"GET http://files.example/bytes/10 HTTP/1.1\r\n\r\n", b"CONNECT other.example:443 HTTP/1.1\r\n\r\n",
                     b"GET / HTTP/1.1\r\n\r\n", b"GET http://files.example/bytes/99999999 HTTP/1.1\r\n\r\n"):
            await served.ask(head)
        served.proxy.set_policy(EgressPolicy.parse(["files.example"]))
        reader, writer = await served.open()
        writer.write(b"CONNECT files.example:443 HTTP/1.1\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        served.proxy.set_policy(EgressPolicy.parse(["other.example"]))
        assert await until_closed(reader) == 0
        writer.close()
        await wait_for(lambda: served.proxy.open_connections == 0)
    await wait_for(lambda: open_descriptors() <= before)


async def test_a_slow_reader_gets_the_whole_answer_after_the_origin_is_done(origin):
    network = ScriptedNetwork(origin.port, {"files.example": [[PUBLIC]]})
    size = 8 << 20
    async with serve(EgressPolicy.parse(["files.example"]), network) as served:
        reader, writer = await served.open()
        writer.write(f"GET http://files.example/bytes/{size} HTTP/1.1\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        received = 0
        async with asyncio.timeout(60):
            while data := await reader.read(64 * 1024):
                received += len(data)
                await asyncio.sleep(0.01)
        writer.close()
    assert head.endswith(b"Content-Length: %d\r\n\r\n" % size) and received == size
    assert served.events[-1].reason == "eof" and served.events[-1].bytes_down == len(head) + size


async def test_the_standard_librarys_clients_work_through_it(origin):
    """urllib with a proxy (plain HTTP) and http.client's tunnel (CONNECT), as pip's stack uses it."""
    policy = EgressPolicy.parse([f"localhost:{origin.port}"], addresses=LOOPBACK_RULES)
    async with serve(policy) as served:
        proxy_url = f"http://127.0.0.1:{served.port}"

        def plain() -> bytes:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
            with opener.open(f"http://localhost:{origin.port}/bytes/7", timeout=30) as response:
                return response.read()

        def tunnelled() -> bytes:
            connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
            connection.set_tunnel("localhost", origin.port)
            try:
                connection.request("GET", "/bytes/9")
                return connection.getresponse().read()
            finally:
                connection.close()

        assert await asyncio.to_thread(plain) == b"x" * 7
        assert await asyncio.to_thread(tunnelled) == b"x" * 9
        await wait_for(lambda: served.kinds().count("closed") == 2)
    assert [e.method for e in served.events if e.kind == "allowed"] == ["GET", "CONNECT"]


async def test_cancelling_a_handler_ends_its_connection_at_once(origin):
    """A dialer that stops cancels its handlers: they end without waiting for slow peers."""
    network = ScriptedNetwork(origin.port, {"files.example": [[PUBLIC]]})
    events = []
    proxy = EgressProxy(EgressPolicy.parse(["files.example"]), sandbox="s", network=network, on_event=events.append)
    handlers = []

    async def handle(sock):
        handlers.append(asyncio.current_task())
        await proxy.handle(sock)

    with accepting(handle) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET http://files.example/bytes/{1 << 34} HTTP/1.1\r\n\r\n".encode())
        await reader.readexactly(1 << 20)  # the client now stops reading: buffers fill up
        await wait_for(lambda: handlers)
        handlers[0].cancel()
        await asyncio.wait_for(asyncio.gather(handlers[0], return_exceptions=True), 5)
        assert proxy.open_connections == 0 and events[-1].reason == "cancelled"
        writer.close()


async def test_a_request_head_that_came_while_the_loop_was_held_past_its_deadline_is_served(origin):
    """A blocking step of the host's caller held the loop past a connection's head deadline
    while the command sent its request: the head waits unread behind the deadline's own
    callback, and is served instead of refused as late."""
    limits = EgressLimits(head_seconds=2.0)  # far longer than the few turns before the test holds the loop
    network = ScriptedNetwork(origin.port, {"files.example": [[PUBLIC]]})
    async with serve(EgressPolicy.parse(["files.example"], limits=limits), network) as served:
        reader, writer = await served.open()
        await wait_for(lambda: served.proxy.open_connections == 1)  # admitted: its head is awaited
        writer.write(b"GET http://files.example/bytes/2 HTTP/1.1\r\n\r\n")  # sent at once: the buffer is empty
        time.sleep(limits.head_seconds + 2 * LATE_SECONDS)  # held up well past the deadline
        async with asyncio.timeout(30):
            answer = await reader.read()
        writer.close()
        assert answer.endswith(b"\r\n\r\nxx"), answer
