"""fetch_url(): public destinations only, validated again at every redirect, bounded transfers.

DNS answers come from a scripted resolver, so a public-looking name that resolves to a private
address (DNS rebinding) is observable at each hop; the pages are served over real HTTP/1.1 by a
local site. The system network is exercised against the OS resolver and a real TLS server.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protolink import Agent, AgentCard
from protolink.core.runs import RunContext
from protolink.tools import fetch_url
from protolink.tools.builtins import fetch
from protolink.net.addresses import Destination
from protolink.tools.net.http1 import open_response
from protolink.net.network import SystemNetwork, use_network
from tests.held_loop import DEADLINE_SECONDS, HELD_SECONDS
from tests.unit.tools.web_support import Reply, ScriptedNetwork, Site, fixture

pytestmark = pytest.mark.asyncio(loop_scope="session")  # the same loop as the async site fixture

HTML = [("Content-Type", "text/html")]
PUBLIC = "93.184.215.14"


@pytest.fixture
async def site():
    async with Site() as site:
        yield site


@pytest.fixture
def network(site: Site):
    dns = {name: [[PUBLIC]] for name in ("www.example.org", "a.example", "b.example", "c.example")}
    with use_network(ScriptedNetwork(site, dns)) as net:
        yield net


def redirect(location: str, status: int = 302) -> Reply:
    return Reply(status, [("Location", location)])


# -- content -------------------------------------------------------------------------------------


async def test_an_html_page_becomes_title_and_readable_text(site, network):
    site.route("www.example.org", "/article", Reply(200, HTML, fixture("article_windows1252.html")))

    page = await fetch_url()(url="https://www.example.org/article")

    assert page["url"] == "https://www.example.org/article"
    assert page["status"] == 200
    assert page["content_type"] == "text/html"
    assert page["title"] == "Le café & la ville — Chronique"
    assert page["text"].splitlines() == [
        "Accueil | Archives",
        "Le café du coin",
        "Chaque matin, le café ouvre à 7 h. Les habitués arrivent tôt.",
        "Espresso – 1,50 €",
        "Crème – 2,80 €",
        "Jour Heures",
        "Lundi 7–19",
        "© 2025 La Chronique",
    ]
    assert page["truncated"] is False
    assert page["untrusted_content"] is True
    for hidden in ("do not extract", "injected", "font-family", "Activez", "template content"):
        assert hidden not in page["text"]


async def test_max_chars_truncates_and_says_so(site, network):
    site.route("www.example.org", "/plain", Reply(200, [("Content-Type", "text/plain; charset=utf-8")], b"abcdefghij"))

    page = await fetch_url()(url="https://www.example.org/plain", max_chars=4)
    assert (page["text"], page["truncated"], page["title"]) == ("abcd", True, None)
    page = await fetch_url()(url="https://www.example.org/plain", max_chars=10)
    assert (page["text"], page["truncated"]) == ("abcdefghij", False)


@pytest.mark.parametrize("markup", [b"<title>" + b"t" * 900_000 + b"</title><p>body</p>",
                                    b"<title>never closed<p>" + b"b" * 900_000])
async def test_a_title_is_at_most_300_characters_and_a_cut_one_says_so(site, network, markup):
    site.route("www.example.org", "/long", Reply(200, HTML, markup))

    page = await fetch_url()(url="https://www.example.org/long", max_chars=10)

    assert len(page["title"]) == 300
    assert page["truncated"] is True
    assert fetch_url().output_schema["properties"]["title"]["maxLength"] == 300


@pytest.mark.parametrize("max_chars", [0, 50_001])
async def test_max_chars_is_bounded(network, max_chars):
    with pytest.raises(ValueError, match="max_chars"):
        await fetch_url()(url="https://www.example.org/", max_chars=max_chars)


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ([("Content-Type", "text/plain; charset=iso-8859-7")], "Καλημέρα".encode("iso-8859-7"), "Καλημέρα"),
        (HTML, '<meta charset="koi8-r"><p>Привет</p>'.encode("koi8-r"), "Привет"),
        ([("Content-Type", "text/plain")], "naïve".encode("utf-8"), "naïve"),
        ([("Content-Type", "text/plain")], "naïve".encode("cp1252"), "naïve"),  # legacy fallback
        ([("Content-Type", "text/plain")], "\ufeffbom".encode("utf-16-le"), "bom"),
        ([("Content-Type", "application/json")], '{"k": "v"}'.encode(), '{"k": "v"}'),
    ],
)
async def test_charsets_come_from_header_meta_bom_or_fallback(site, network, headers, body, expected):
    site.route("www.example.org", "/doc", Reply(200, headers, body))

    page = await fetch_url()(url="https://www.example.org/doc")

    assert page["text"] == expected


async def test_html_the_parser_cannot_read_is_a_runtime_error(site, network):
    site.route("www.example.org", "/odd", Reply(200, HTML, b"<p>text</p><![bogus section]>"))

    with pytest.raises(RuntimeError, match="could not parse the HTML"):
        await fetch_url()(url="https://www.example.org/odd")


async def test_an_unknown_charset_is_a_runtime_error(site, network):
    site.route("www.example.org", "/doc", Reply(200, [("Content-Type", "text/plain; charset=x-no-such")], b"x"))

    with pytest.raises(RuntimeError, match="charset"):
        await fetch_url()(url="https://www.example.org/doc")


@pytest.mark.parametrize("headers", [[("Content-Type", "image/png")], [("Content-Type", "application/pdf")], []])
async def test_only_text_content_types_are_returned(site, network, headers):
    site.route("www.example.org", "/file", Reply(200, headers, b"\x89PNG\r\n"))

    with pytest.raises(RuntimeError, match="content type"):
        await fetch_url()(url="https://www.example.org/file")


@pytest.mark.parametrize("status", [404, 500, 204])
async def test_http_failures_are_runtime_errors(site, network, status):
    site.route("www.example.org", "/x", Reply(status, HTML, b"" if status == 204 else b"<p>error page</p>"))

    if status == 204:
        assert (await fetch_url()(url="https://www.example.org/x"))["text"] == ""
    else:
        with pytest.raises(RuntimeError, match=f"HTTP {status}"):
            await fetch_url()(url="https://www.example.org/x")


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
async def test_responses_over_one_million_bytes_are_refused(site, network, framing):
    body = b"a" * (fetch.MAX_RESPONSE_BYTES + 1)
    site.route("www.example.org", "/big", Reply(200, [("Content-Type", "text/plain")], body, framing=framing))

    with pytest.raises(RuntimeError, match="larger than 1000000 bytes"):
        await fetch_url()(url="https://www.example.org/big")


async def test_exactly_one_million_bytes_is_accepted(site, network):
    body = b"a" * fetch.MAX_RESPONSE_BYTES
    site.route("www.example.org", "/big", Reply(200, [("Content-Type", "text/plain")], body, framing="chunked"))

    page = await fetch_url()(url="https://www.example.org/big", max_chars=50_000)

    assert page["truncated"] is True and len(page["text"]) == 50_000


async def test_a_silent_server_hits_the_transport_deadline(site, network, monkeypatch):
    monkeypatch.setattr(fetch, "TRANSPORT_SECONDS", 0.2)
    site.route("www.example.org", "/slow", Reply(stall=True))

    with pytest.raises(RuntimeError, match="timed out after 0.2 seconds"):
        await fetch_url()(url="https://www.example.org/slow")
    await asyncio.wait_for(site.closed.wait(), 30)


async def test_a_page_that_came_while_the_loop_was_held_past_the_deadline_is_returned(site, network, monkeypatch):
    """A blocking step of the caller's held the loop past the transport deadline once the page
    was sent: it waits unread behind the deadline's own callback, and the fetch returns it
    instead of failing as one that timed out."""
    monkeypatch.setattr(fetch, "TRANSPORT_SECONDS", DEADLINE_SECONDS)
    body = b"sent in time"

    async def sent_then_held() -> AsyncIterator[bytes]:
        yield body
        time.sleep(HELD_SECONDS)  # in the step that sent the page, before the client sees it

    headers = [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))]
    site.route("www.example.org", "/held", Reply(200, headers, body_stream=sent_then_held))

    page = await fetch_url()(url="https://www.example.org/held")

    assert page["text"] == "sent in time"


async def test_cancellation_closes_the_connection(site, network):
    site.route("www.example.org", "/slow", Reply(stall=True))
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"))
    agent.add_tool(fetch_url())
    call = asyncio.create_task(agent.call_tool("fetch_url", context=RunContext(), url="https://www.example.org/slow"))
    while not site.requests:
        await asyncio.sleep(0.01)

    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(site.closed.wait(), 30)


# -- destinations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "ftp://www.example.org/file",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "www.example.org/no-scheme",
        "https://user:secret@www.example.org/",
        "https://token@www.example.org/",
        "http://www.example.org:8080/",
        "https://www.example.org:8443/",
        "http://www.example.org:443/",
        "http://127.0.0.1/",
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://0x7f.0.0.1/",
        "http://0x7f000001/",
        "http://127.1/",
        "http://017700000001/",
        "http://10.0.0.1/",
        "http://172.16.5.4/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        "http://240.0.0.1/",
        "http://255.255.255.255/",
        "http://192.0.2.10/",
        "http://[::1]/",
        "http://[::]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[fec0::1]/",
        "http://[::127.0.0.1]/",
        "http://[ff02::1]/",
        "http://[2002:7f00:1::1]/",
        "http://[64:ff9b::7f00:1]/",
        "http://[2001:db8::1]/",
        "https://www.example.org/" + "a" * 2030,
        "http://exa mple.org/",
    ],
)
async def test_non_public_or_malformed_destinations_are_value_errors(network, url):
    with pytest.raises(ValueError):
        await fetch_url()(url=url)

    assert network.connections == []


async def test_a_public_address_literal_is_fetched_without_dns(site, network):
    site.route(PUBLIC, "/", Reply(200, [("Content-Type", "text/plain")], b"ok"))

    page = await fetch_url()(url=f"http://{PUBLIC}/")

    assert page["text"] == "ok" and network.lookups == []
    assert network.connections == [(PUBLIC, 80, None)]


@pytest.mark.parametrize("answers", [["127.0.0.1"], ["169.254.169.254"], [PUBLIC, "10.1.2.3"], ["::1"], ["fd00::5"]])
async def test_a_public_looking_name_resolving_privately_is_refused(site, network, answers):
    network.dns["internal.example"] = [answers]

    with pytest.raises(ValueError, match="not a public destination"):
        await fetch_url()(url="https://internal.example/")

    assert network.connections == [] and site.requests == []


async def test_the_connection_is_pinned_to_the_validated_address(site, network):
    network.dns["www.example.org"] = [[PUBLIC, "2606:2800:21f:cb07:6820:80da:af6b:8b2c"]]
    site.route("www.example.org", "/", Reply(200, [("Content-Type", "text/plain")], b"ok"))

    await fetch_url()(url="https://www.example.org/")

    assert network.connections == [(PUBLIC, 443, "www.example.org")]
    assert site.requests[0].headers["host"] == "www.example.org"


# -- redirects -------------------------------------------------------------------------------


async def test_redirects_are_followed_to_validated_destinations(site, network):
    site.route("a.example", "/start", redirect("https://b.example/next?x=1", 301))
    site.route("b.example", "/next", redirect("/final", 307))
    site.route("b.example", "/final", Reply(200, [("Content-Type", "text/plain")], b"arrived"))

    page = await fetch_url()(url="https://a.example/start")

    assert page["url"] == "https://b.example/final" and page["text"] == "arrived"
    assert network.lookups == ["a.example", "b.example", "b.example"]


@pytest.mark.parametrize(
    "location",
    [
        "http://127.0.0.1/admin",
        "http://2130706433/",
        "http://[::ffff:169.254.169.254]/",
        "https://metadata.example/latest",  # resolves to 169.254.169.254
        "gopher://a.example/",
        "https://user:pw@b.example/",
        "https://b.example:8443/",
    ],
)
async def test_a_redirect_to_a_non_public_destination_is_refused(site, network, location):
    network.dns["metadata.example"] = [["169.254.169.254"]]
    site.route("a.example", "/start", redirect(location))

    with pytest.raises(ValueError):
        await fetch_url()(url="https://a.example/start")

    assert [address for address, _, _ in network.connections] == [PUBLIC]


async def test_every_hop_is_resolved_again_against_dns_rebinding(site, network):
    network.dns["a.example"] = [[PUBLIC], ["127.0.0.1"]]  # the second lookup rebinds to loopback
    site.route("a.example", "/start", redirect("/again"))

    with pytest.raises(ValueError, match="127.0.0.1"):
        await fetch_url()(url="https://a.example/start")

    assert network.lookups == ["a.example", "a.example"]
    assert len(network.connections) == 1


async def test_https_never_downgrades_to_http(site, network):
    site.route("a.example", "/start", redirect("http://b.example/"))

    with pytest.raises(ValueError, match="HTTPS to HTTP"):
        await fetch_url()(url="https://a.example/start")


async def test_at_most_four_redirects_are_followed(site, network):
    for hop in range(5):
        site.route("a.example", f"/{hop}", redirect(f"/{hop + 1}"))
    site.route("a.example", "/4", Reply(200, [("Content-Type", "text/plain")], b"four hops"))

    assert (await fetch_url()(url="https://a.example/0"))["text"] == "four hops"

    site.route("a.example", "/4", redirect("/5"))
    site.route("a.example", "/5", Reply(200, [("Content-Type", "text/plain")], b"five hops"))
    with pytest.raises(RuntimeError, match="too many redirects"):
        await fetch_url()(url="https://a.example/0")


async def test_a_redirect_without_location_is_a_runtime_error(site, network):
    site.route("a.example", "/start", Reply(302))

    with pytest.raises(RuntimeError, match="Location"):
        await fetch_url()(url="https://a.example/start")


# -- the system network ------------------------------------------------------------------------


async def test_the_operating_system_resolver_answer_is_validated():
    with pytest.raises(ValueError, match="not a public destination"):
        await fetch_url()(url="http://localhost/")


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name}"],
        check=True, capture_output=True,
    )
    return cert, key


async def test_system_connections_go_to_the_pinned_address_with_the_url_host_for_tls(tmp_path):
    cert, key = _certificate(tmp_path, "pinned.test")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    seen: list[str | None] = []
    server_context.sni_callback = lambda sock, name, context: seen.append(name)
    heads: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n\r\npinned")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    loopback = (ipaddress.ip_address("127.0.0.1"),)
    network = SystemNetwork(ssl_context=ssl.create_default_context(cafile=str(cert)))
    try:
        with use_network(network):
            # "pinned.test" does not resolve anywhere: the connection uses the given address only.
            pinned = Destination("https://pinned.test/page", "https", "pinned.test", port, "/page")
            async with open_response(pinned, loopback) as response:
                assert await response.read(100) == b"pinned"
            assert seen == ["pinned.test"]
            assert b"Host: pinned.test:%d\r\n" % port in heads[0]

            other = Destination("https://other.test/page", "https", "other.test", port, "/page")
            with pytest.raises(RuntimeError, match="certificate"):
                async with open_response(other, loopback):
                    pass
    finally:
        server.close()
        await server.wait_closed()


async def test_the_tool_is_a_plain_network_read_builtin():
    tool = fetch_url()

    assert (tool.name, tool.capabilities) == ("fetch_url", ("network.read",))
    assert tool.builtin == "protolink.tools.builtins.fetch:fetch_url"
    assert "read-only" in tool.tags
    assert tool.input_schema["properties"]["url"]["maxLength"] == 2048
    assert tool.output_schema["required"] == ["url", "status", "content_type", "title", "text", "truncated",
                                              "untrusted_content"]
