"""The request head, read strictly: what is accepted, and every smuggling shape refused."""

from __future__ import annotations

import ipaddress

import pytest

from protolink.sandbox.egress.request import Refusal, parse_head


def test_connect_in_authority_form():
    request = parse_head(b"CONNECT PyPI.org.:443 HTTP/1.1\r\nHost: pypi.org:443\r\nUser-Agent: pip", b"\x16\x03")
    assert (request.method, request.host, request.port, request.address) == ("CONNECT", "pypi.org", 443, None)
    assert request.leftover == b"\x16\x03" and request.forward_head == b""


@pytest.mark.parametrize(("target", "address"), [
    ("2130706433:443", "127.0.0.1"), ("0177.0.0.1:443", "127.0.0.1"), ("0x7f.1:443", "127.0.0.1"),
    ("[::ffff:127.0.0.1]:443", "::ffff:7f00:1"), ("169.254.169.254:80", "169.254.169.254"),
])
def test_ip_literals_in_any_spelling_are_literals(target, address):
    request = parse_head(f"CONNECT {target} HTTP/1.1".encode())
    assert request.address == ipaddress.ip_address(address) and request.host == address


def test_plain_http_is_forwarded_in_origin_form_without_hop_by_hop_fields():
    head = (b"POST http://Example.org:8080/a/b?c=d HTTP/1.1\r\nHost: elsewhere.example\r\n"
            b"Proxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive, X-Secret\r\n"
            b"X-Secret: 1\r\nKeep-Alive: 5\r\nUpgrade: websocket\r\nAccept: */*\r\nContent-Length: 3")
    request = parse_head(head, b"abc")
    assert (request.method, request.host, request.port, request.body_length) == ("POST", "example.org", 8080, 3)
    assert request.forward_head == (b"POST /a/b?c=d HTTP/1.1\r\nHost: example.org:8080\r\nAccept: */*\r\n"
                                    b"Content-Length: 3\r\nConnection: close\r\n\r\n")


def test_plain_http_defaults():
    request = parse_head(b"GET http://example.org HTTP/1.0")
    assert request.port == 80 and request.body_length == 0
    assert request.forward_head == b"GET / HTTP/1.0\r\nHost: example.org\r\nConnection: close\r\n\r\n"
    assert parse_head(b"GET http://example.org?x HTTP/1.1").forward_head.startswith(b"GET /?x HTTP/1.1\r\n")


@pytest.mark.parametrize(("head", "status", "reason"), [
    (b"GET / HTTP/1.1\r\nHost: example.org", 400, "absolute http:// URL"),
    (b"GET https://example.org/ HTTP/1.1", 400, "use CONNECT for https"),
    (b"GET ftp://example.org/ HTTP/1.1", 400, "only http://"),
    (b"OPTIONS * HTTP/1.1", 400, "absolute http:// URL"),
    (b"CONNECT http://example.org:443 HTTP/1.1", 400, "authority"),
    (b"CONNECT http://example.org:443/ HTTP/1.1", 400, "authority"),
    (b"CONNECT example.org HTTP/1.1", 400, "host:port"),
    (b"CONNECT user@example.org:443 HTTP/1.1", 400, "authority"),
    (b"CONNECT example.org:443 HTTP/1.1\r\nHost: a.example:443\r\nHost: example.org:443", 400, "more than one Host"),
    (b"GET http://example.org/ HTTP/1.1\r\nHost: example.org\r\nHost: evil.example", 400, "more than one Host"),
    (b"CONNECT example.org:443 HTTP/1.1\r\nHost: evil.example:443", 400, "does not name the CONNECT target"),
    (b"CONNECT example.org:443 HTTP/1.1\r\nHost: example.org:80", 400, "does not name the CONNECT target"),
    (b"CONNECT  example.org:443 HTTP/1.1", 400, "single spaces"),
    (b"CONNECT example.org:443  HTTP/1.1", 400, "single spaces"),
    (b"CONNECT example.org:443 HTTP/1.1 ", 400, "single spaces"),
    (b"CONNECT example.org:443 evil.example:443 HTTP/1.1", 400, "single spaces"),
    (b"CONNECT\texample.org:443 HTTP/1.1", 400, "single spaces"),
    (b"CONNECT example.org:443\x00 HTTP/1.1", 400, "malformed request line"),
    (b"CONNECT example.org\x00.evil:443 HTTP/1.1", 400, "malformed request line"),
    (b"GET http://example.org/\xff HTTP/1.1", 400, "malformed request line"),
    (b"CONNECT example.org:443 HTTP/2.0", 400, "malformed request line"),
    (b"CONNECT example.org:443 HTTP/1.1\nHost: example.org:443", 400, "bare CR or LF"),
    (b"CONNECT example.org:443 HTTP/1.1\r\nX: a\rb", 400, "bare CR or LF"),
    (b"CONNECT example.org:443 HTTP/1.1\r\nX: a\r\n b", 400, "line folding"),
    (b"CONNECT example.org:443 HTTP/1.1\r\nX : a", 400, "malformed header"),
    (b"CONNECT example.org:443 HTTP/1.1\r\nX: a\x00b", 400, "malformed header"),
    (b"CONNECT example.org:443 HTTP/1.1\r\nno colon", 400, "malformed header"),
    (b"CONNECT example.org:99999 HTTP/1.1", 400, "port"),
    (b"CONNECT exa mple.org:443 HTTP/1.1", 400, "single spaces"),
    (b"CONNECT exa_mple..org:443 HTTP/1.1", 400, "invalid host"),
    (b"CONNECT 1.2.3.4.5:443 HTTP/1.1", 400, "invalid IPv4"),
    (b"CONNECT ::1:443 HTTP/1.1", 400, "invalid host"),
    (b"GET http://user:pw@example.org/ HTTP/1.1", 400, "credentials"),
    (b"GET http://example.org/#x HTTP/1.1", 400, "fragment"),
    (b"POST http://example.org/ HTTP/1.1\r\nTransfer-Encoding: chunked", 411, "Transfer-Encoding"),
    (b"POST http://example.org/ HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked", 411, "Transfer"),
    (b"POST http://example.org/ HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4", 400, "Content-Length"),
    (b"POST http://example.org/ HTTP/1.1\r\nContent-Length: -3", 400, "Content-Length"),
    (b"CONNECT example.org:443 HTTP/1.1" + b"\r\nX: y" * 101, 431, "header fields"),
])
def test_refused_heads(head, status, reason):
    with pytest.raises(Refusal) as caught:
        parse_head(head)
    assert caught.value.status == status and reason in caught.value.reason
