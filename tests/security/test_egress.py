"""Egress: a sandbox with an allow-list reaches exactly what it allows, through its host-side
proxy, and nothing else. Commands inside use the proxy variables the server gives them; the
host side is the real EgressService (relay, dialer, EgressProxy); the servers reached run on
this host's loopback, opened to the sandbox only by a test-only address rule (LOOPBACK).

Names: ``*.egress.test`` are answered by the test resolver (:class:`NamesForTests`, through
the Network seam): most lead to loopback, some to a private or the metadata address, one
rebinds; every other name goes to the system's resolver. Most tests share one sandbox and set
the policy they need on it, live (``set_egress``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import errno
import http.server
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protolink.net.addresses import IPAddress
from protolink.net.network import SystemNetwork, use_network
from protolink.net.rules import EGRESS_ADDRESS_RULES
from protolink.sandbox.config import MiB
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.egress.events import EgressEvent
from protolink.sandbox.egress.policy import DENY_ALL, EgressLimits, EgressPolicy
from protolink.sandbox.placements.server import EGRESS_PORT

from .conftest import GVISOR, HANG_GUARD, LIMITS, NO_ROUTE, NOBODY, PYTHON, RUNTIME, Attacker, still_serves

pytestmark = pytest.mark.docker

GiB = 1 << 30
#: The test-only opt-in: the host's loopback, where the test servers listen.
LOOPBACK = EGRESS_ADDRESS_RULES.allowing("127.0.0.0/8")
#: Names the test resolver answers; everything else goes to the system's resolver.
TEST_NAMES = {"web.egress.test": "127.0.0.1", "git.egress.test": "127.0.0.1",
              "private.egress.test": "10.0.0.1", "metadata.egress.test": "169.254.169.254"}
#: A small pure-Python package on the index.
PACKAGE = "six"
HELLO = "hello through the egress proxy\n"
PROXY_VARIABLES = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
                   "http_proxy", "https_proxy", "all_proxy", "no_proxy"}


#: A public address the test network stands in for with this host's loopback (it is never reached).
PUBLIC = "203.0.113.7"
#: A name the test resolver answers first with PUBLIC, then with loopback (DNS rebinding).
REBINDING = "rebind.egress.test"
#: A name the test resolver answers with PUBLIC and a private address at once.
MIXED = "mixed.egress.test"


class NamesForTests:
    """The system's network, with :data:`TEST_NAMES`, :data:`REBINDING` and :data:`MIXED`
    answered here, and :data:`PUBLIC` standing for a server on this host's loopback. It records
    every resolution of the rebinding name and every address the proxy connects to."""

    def __init__(self) -> None:
        self._system = SystemNetwork()
        self.rebinding_answers: list[str] = []
        self.connected: list[str] = []

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        if host == REBINDING:
            self.rebinding_answers.append("127.0.0.1" if self.rebinding_answers else PUBLIC)
            return [self.rebinding_answers[-1]]
        if host == MIXED:
            return [PUBLIC, "10.0.0.1"]
        return [TEST_NAMES[host]] if host in TEST_NAMES else await self._system.resolve(host, port)

    async def connect_tcp(self, address: IPAddress, port: int) -> socket.socket:
        self.connected.append(str(address))
        target = ipaddress.ip_address("127.0.0.1") if str(address) == PUBLIC else address
        return await self._system.connect_tcp(target, port)


# -- servers on this host's loopback ------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Files of the served directory (a git repository over dumb HTTP), and generated bodies:
    ``/stream`` (endless, paced), ``/gib`` (1 GiB of zeros, never held in memory)."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
        self.server.hosts.append(self.headers.get("Host", ""))
        if self.path == "/stream":
            self._generate(None, pause=0.02)
        elif self.path == "/gib":
            self._generate(GiB, pause=0.0)
        else:
            super().do_GET()

    def _generate(self, length: int | None, *, pause: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length if length is not None else 1 << 50))
        self.end_headers()
        chunk = bytes(256 * 1024) if length else bytes(32 * 1024)
        sent = 0
        try:
            while length is None or sent < length:
                self.wfile.write(chunk)
                sent += len(chunk)
                self.server.sent += len(chunk)
                time.sleep(pause)
        except OSError:
            self.server.ended.append(time.time())


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    sent = 0
    ended: list[float]
    hosts: list[str]  # the Host header of every request


@dataclass
class Servers:
    """An HTTP and an HTTPS server on loopback serving ``directory`` (the test CA signs the HTTPS one's certificate)."""

    http_port: int
    https_port: int
    directory: Path
    http: _Server
    https: _Server


def _make_tls(public: Path, private: Path) -> tuple[Path, Path, Path]:
    """A test CA (``public``/ca.pem) and a certificate for the ``*.egress.test`` names signed
    by it, with its key (in ``private``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "protolink egress test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "web.egress.test")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name) for name in TEST_NAMES]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = public / "ca.pem", private / "server.pem", private / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def _serve(server: _Server) -> None:
    threading.Thread(target=server.serve_forever, daemon=True).start()


@contextlib.contextmanager
def loopback_servers(served: Path, public: Path) -> Iterator[Servers]:
    """Serve ``served`` over HTTP and HTTPS; the test CA goes to ``public``/ca.pem."""
    private = Path(tempfile.mkdtemp(prefix="protolink-egress-tls-"))
    _, cert, key = _make_tls(public, private)
    (served / "hello.txt").write_text(HELLO)
    handler = lambda *args: _Handler(*args, directory=str(served))  # noqa: E731
    plain, secure = _Server(("127.0.0.1", 0), handler), _Server(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    shutil.rmtree(private)
    for server in (plain, secure):
        server.ended, server.hosts = [], []
        _serve(server)
    try:
        yield Servers(plain.server_address[1], secure.server_address[1], served, plain, secure)
    finally:
        for server in (plain, secure):
            server.shutdown()
            server.server_close()


def _git_repository(served: Path) -> None:
    """A bare repository with one commit, ready for dumb HTTP (update-server-info)."""
    work = served / "src"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(served), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True, env=env)
    (work / "README").write_text("cloned through the egress proxy\n")
    subprocess.run(["git", "-C", str(work), "add", "README"], check=True, env=env)
    subprocess.run(["git", "-C", str(work), "commit", "-q", "-m", "one"], check=True, env=env)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(served / "repo.git")], check=True, env=env)
    subprocess.run(["git", "-C", str(served / "repo.git"), "update-server-info"], check=True, env=env)


# -- the package index, as pip on this host is configured ----------------------------------------


@dataclass(frozen=True)
class Index:
    """pip's index (its ``index-url``, or pip's default), the host its pages link files on,
    and the CA bundle pip is configured with (``cert``), if any."""

    url: str
    files_host: str
    cert: Path | None

    @property
    def host(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or ""


def pip_index() -> Index:
    """Read from pip's configuration (``pip config list``, which includes PIP_* variables) and
    defaults; the files host from the index's own page for :data:`PACKAGE`. Unreachable: fail."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout
    settings = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        settings[key.rsplit(".", 1)[-1]] = value.strip().strip("'\"")
    if "index-url" in settings:
        url = settings["index-url"]
    else:
        from pip._internal.models.index import PyPI

        url = PyPI.simple_url
    cert = Path(settings["cert"]) if settings.get("cert") else None
    context = ssl.create_default_context(cafile=str(cert) if cert else None)
    page_url = f"{url.rstrip('/')}/{PACKAGE}/"
    try:
        with urllib.request.urlopen(urllib.request.Request(page_url), timeout=60, context=context) as answer:
            page = answer.read().decode("utf-8", "replace")
    except OSError as error:
        pytest.fail(f"the package index {url} (pip's configuration) is not reachable from this host: {error}")
    hosts = {urllib.parse.urlsplit(link).hostname for link in _links(page, page_url)}
    hosts.discard(None)
    assert hosts, f"the index page {page_url} links no files"
    return Index(url, sorted(hosts)[0], cert)  # type: ignore[arg-type]


def _links(page: str, base: str) -> list[str]:
    import html.parser

    links: list[str] = []

    class Links(html.parser.HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            links.extend(urllib.parse.urljoin(base, value) for name, value in attrs if name == "href" and value)

    Links().feed(page)
    return links


# -- the sandbox ---------------------------------------------------------------------------------


class EventLog:
    """The events a proxy reported since the last clear, and how many allowed connections have
    not yet reported their end (every ``allowed`` is followed by one ``closed``)."""

    def __init__(self) -> None:
        self.events: list[EgressEvent] = []
        self.open = 0

    def __call__(self, event: EgressEvent) -> None:
        self.events.append(event)
        self.open += {"allowed": 1, "closed": -1}.get(event.kind, 0)


@dataclass
class Egress:
    """The module's sandbox with egress, its workspace and read-only root, and the events its
    proxy reported."""

    box: DockerSandbox
    attacker: Attacker
    ro: Path
    servers: Servers
    names: NamesForTests
    log: EventLog

    @property
    def events(self) -> list[EgressEvent]:
        return self.log.events

    async def allow(self, rules: list[str], *, loopback: bool = False, **limits: Any) -> None:
        """Set the live sandbox's policy to ``rules`` (with the loopback opt-in when asked)
        and forget the events so far, once the connections of earlier tests have ended: a
        change would close one still ending, and its event would look like this test's."""
        async with asyncio.timeout(HANG_GUARD):
            while self.log.open:
                await asyncio.sleep(0.05)
        addresses = LOOPBACK if loopback else EGRESS_ADDRESS_RULES
        await self.box.set_egress(EgressPolicy.parse(rules, addresses=addresses, limits=EgressLimits(**limits)))
        self.events.clear()

    def denied(self) -> list[str]:
        return [event.reason for event in self.events if event.kind == "denied"]

    async def run(self, argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 60,
                  max_output_bytes: int = 1 << 20) -> Any:
        return await self.attacker.call(
            "execute_command", argv=argv, cwd=str(self.attacker.ws),
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", **(env or {})},
            timeout_seconds=timeout, max_output_bytes=max_output_bytes, guard=timeout + 60)

    async def probe(self, code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
        result = await self.run([PYTHON, "-c", code, *args], env=env, timeout=timeout)
        assert result.exit_code == 0, result
        return json.loads(result.stdout.strip().splitlines()[-1])


@contextlib.asynccontextmanager
async def egress_sandbox(image: str, names: NamesForTests, *, ro: Sequence[Path] = (), writable: Sequence[Path] = (),
                         **options: Any) -> AsyncIterator[DockerSandbox]:
    """A sandbox with egress whose proxy uses ``names`` (the Network seam is read once, when
    the proxy is made as the sandbox starts); removed on exit."""
    box = DockerSandbox(list(ro), writable=list(writable), image=image, runtime=RUNTIME, **{**LIMITS, **options})
    with use_network(names):
        await box.start()
    try:
        yield box
    finally:
        await box.aclose()


@pytest.fixture(scope="module")
async def egress(sandbox_image: str) -> AsyncIterator[Egress]:
    """One sandbox with egress for the module (deny-all until a test allows something)."""
    base = Path(tempfile.mkdtemp(prefix="protolink-egress-")).resolve()
    base.chmod(0o755)
    work, ro, served = base / "work", base / "ro", base / "served"
    for directory in (work, ro, served):
        directory.mkdir()
    os.chown(work, NOBODY, NOBODY)
    _git_repository(served)
    log = EventLog()
    names = NamesForTests()
    try:
        with loopback_servers(served, ro) as servers:
            async with egress_sandbox(sandbox_image, names, ro=[ro], writable=[work], egress=DENY_ALL,
                                      on_egress_event=log) as box:
                yield Egress(box, Attacker(box.backend, work), ro, servers, names, log)
    finally:
        shutil.rmtree(base, ignore_errors=True)


FETCH = r"""
import json, ssl, sys, urllib.request
context = ssl.create_default_context(cafile=sys.argv[2]) if len(sys.argv) > 2 else None
try:
    with urllib.request.urlopen(sys.argv[1], timeout=30, context=context) as answer:
        print(json.dumps({'status': answer.status, 'body': answer.read().decode()}))
except urllib.error.HTTPError as error:
    print(json.dumps({'status': error.code, 'body': error.read().decode()}))
except OSError as error:
    print(json.dumps({'error': str(error)}))
"""

#: CONNECT to each target through the proxy the variables name; the proxy's status line for each.
CONNECT = r"""
import json, os, socket, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ['HTTPS_PROXY'])
answers = {}
for target in json.loads(sys.argv[1]):
    with socket.create_connection((proxy.hostname, proxy.port), timeout=30) as sock:
        sock.sendall(f'CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n'.encode())
        head = b''
        while b'\r\n\r\n' not in head and (data := sock.recv(4096)):
            head += data
        answers[target] = head.split(b'\r\n', 1)[0].decode()
print(json.dumps(answers))
"""


async def connect_through_proxy(egress: Egress, *targets: str) -> dict[str, str]:
    return await egress.probe(CONNECT, json.dumps(targets))


# -- what is allowed -----------------------------------------------------------------------------


async def test_loopback_server_reached_only_with_the_opt_in(egress):
    """A command fetches from a test server on the host's loopback through the proxy variables: plain HTTP (an absolute-form request) and HTTPS (CONNECT, the test CA), allowed by name, with and without the test-only loopback opt-in.

    With the opt-in both answer; without it the proxy refuses both with 403 and the host receives a denied event naming the loopback address; the command sees only the proxy's answer.
    """
    servers, ca = egress.servers, str(egress.ro / "ca.pem")
    urls = (f"http://web.egress.test:{servers.http_port}/hello.txt",
            f"https://web.egress.test:{servers.https_port}/hello.txt")
    rules = [f"web.egress.test:{servers.http_port},{servers.https_port}"]
    await egress.allow(rules, loopback=True)
    for url in urls:
        fetched = await egress.probe(FETCH, url, ca)
        assert fetched == {"status": 200, "body": HELLO}, url
    assert [e.kind for e in egress.events].count("allowed") == 2 and not egress.denied()
    await egress.allow(rules)
    refused = [await egress.probe(FETCH, url, ca) for url in urls]
    assert refused[0]["status"] == 403 and "Tunnel connection failed: 403" in refused[1]["error"], refused
    reasons = egress.denied()
    assert len(reasons) == 2 and all("127.0.0.1 is" in reason and "loopback" in reason for reason in reasons), reasons


async def test_pip_install_from_the_package_index(egress):
    """A sandbox allowed only the package index's hosts (read from pip's configuration: its index and the host its pages link files on, port 443) makes a venv and pip-installs a small pure-Python package, trusting the CA bundle pip is configured with (copied into a root, named by PIP_CERT and SSL_CERT_FILE).

    The venv is made and the package installs and imports inside the sandbox; every connection the proxy allowed went to one of those two hosts.
    """
    index = pip_index()
    env = {"PIP_INDEX_URL": index.url, "PIP_CONFIG_FILE": "/dev/null", "PIP_NO_CACHE_DIR": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if index.cert is not None:
        shutil.copyfile(index.cert, egress.ro / "index-ca.pem")
        env |= {"PIP_CERT": str(egress.ro / "index-ca.pem"), "SSL_CERT_FILE": str(egress.ro / "index-ca.pem")}
    await egress.allow([f"{index.host}:443", f"{index.files_host}:443"])
    venv = egress.attacker.ws / "venv"
    made = await egress.run(["/usr/bin/python3", "-m", "venv", str(venv)], timeout=300)
    assert made.exit_code == 0, made
    installed = await egress.run([f"{venv}/bin/pip", "install", PACKAGE], env=env, timeout=300)
    assert installed.exit_code == 0, (f"pip install {PACKAGE} from {index.url} failed:\n"
                                      f"{installed.stdout}{installed.stderr}")
    imported = await egress.run([f"{venv}/bin/python", "-c", f"import {PACKAGE}; print({PACKAGE}.__name__)"])
    assert imported.stdout == f"{PACKAGE}\n", imported
    allowed = {(event.host, event.port) for event in egress.events if event.kind == "allowed"}
    assert allowed and allowed <= {(index.host, 443), (index.files_host, 443)}, allowed


async def test_git_clone_over_https_through_the_proxy(egress):
    """`git clone` over HTTPS of a repository served by a TLS test server on the host's loopback (trusted through GIT_SSL_CAINFO), allowed by name, with and without the test-only loopback opt-in.

    With the opt-in the clone succeeds and holds the commit; without it git fails (the proxy answers CONNECT with 403) and the host receives the denied event with the loopback reason.
    """
    port = egress.servers.https_port
    url = f"https://git.egress.test:{port}/repo.git"
    env = {"GIT_SSL_CAINFO": str(egress.ro / "ca.pem"), "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    await egress.allow([f"git.egress.test:{port}"], loopback=True)
    target = egress.attacker.ws / "clone"
    cloned = await egress.run(["/usr/bin/git", "clone", "-q", url, str(target)], env=env, timeout=120)
    assert cloned.exit_code == 0, cloned
    assert (target / "README").read_text() == "cloned through the egress proxy\n"
    await egress.allow([f"git.egress.test:{port}"])
    refused = await egress.run(["/usr/bin/git", "clone", "-q", url, str(egress.attacker.ws / "refused")], env=env,
                               timeout=120)
    assert refused.exit_code != 0 and "403" in refused.stderr, refused
    assert egress.denied() and all("loopback" in reason for reason in egress.denied()), egress.denied()


# -- what is refused -----------------------------------------------------------------------------


async def test_refused_destinations(egress):
    """Through the proxy: a host not on the list; an allowed name on a port not allowed; an IP literal (the allowed name's address, no network rule); names that resolve to loopback (localhost, the system's resolver), a private address and the cloud metadata address (the test resolver), each allowed by name.

    Each CONNECT is answered 403, and each denied event names its reason: not on the allow-list, the port, the IP literal, and the denied address (loopback, 10.0.0.1, 169.254.169.254).
    """
    port = egress.servers.https_port
    await egress.allow([f"web.egress.test:{port}", "localhost", "private.egress.test", "metadata.egress.test"])
    answers = await connect_through_proxy(egress, f"other.egress.test:{port}", "web.egress.test:22",
                                          f"127.0.0.1:{port}", "localhost:443", "private.egress.test:443",
                                          "metadata.egress.test:80")
    assert set(answers.values()) == {"HTTP/1.1 403 Forbidden"}, answers
    reasons = egress.denied()
    assert len(reasons) == 6, reasons
    assert "other.egress.test is not on the allow-list" in reasons[0]
    assert "port 22 is not allowed" in reasons[1]
    assert "IP literal 127.0.0.1" in reasons[2]
    assert "localhost resolves to a denied address" in reasons[3] and "loopback" in reasons[3]
    assert "10.0.0.1" in reasons[4] and "private" in reasons[4]
    assert "169.254.169.254" in reasons[5] and "metadata" in reasons[5]


async def test_bypassing_the_proxy_variables(egress):
    """A command ignores the proxy variables: it resolves the allowed name itself and connects straight to the address the host resolves it to, and to the host's loopback test server.

    The kernel refuses: no name resolution (socket.gaierror), no route to the address (ENETUNREACH; EHOSTUNREACH under gVisor), and the container's own loopback answers ECONNREFUSED; the proxy saw nothing.
    """
    index = pip_index()
    address = (await NamesForTests().resolve(index.host, 443))[0]
    await egress.allow([f"{index.host}:443", f"web.egress.test:{egress.servers.http_port}"], loopback=True)
    code = r"""
import json, socket, sys
answers = {}
try:
    socket.getaddrinfo(sys.argv[1], 443)
    answers['resolve'] = 'resolved'
except socket.gaierror:
    answers['resolve'] = 'gaierror'
for name, target in (('index', (sys.argv[2], 443)), ('loopback', ('127.0.0.1', int(sys.argv[3])))):
    with socket.socket(socket.AF_INET6 if ':' in target[0] else socket.AF_INET) as sock:
        sock.settimeout(5)
        try:
            sock.connect(target)
            answers[name] = 'reached'
        except OSError as error:
            answers[name] = error.errno
print(json.dumps(answers))
"""
    answers = await egress.probe(code, index.host, address, str(egress.servers.http_port))
    assert answers["resolve"] == "gaierror"
    assert answers["index"] in (NO_ROUTE, errno.EADDRNOTAVAIL)
    assert answers["loopback"] == errno.ECONNREFUSED
    assert egress.events == []


async def test_the_host_socket_from_a_command(egress):
    """A command connects to the relay's Unix socket (/run/protolink/egress.sock), where the host's standby connections arrive, to pose as the host or take its connections; it also lists and stats the directory.

    Refused: EACCES for all three (gVisor answers EPERM for the paths beneath the directory): the socket is in the host user's private directory. The proxy and its standby connections are untouched and the next fetch through the proxy works.
    """
    code = r"""
import json, os, socket
answers = {}
for name, attempt in (('connect', lambda: socket.socket(socket.AF_UNIX).connect('/run/protolink/egress.sock')),
                      ('stat', lambda: os.stat('/run/protolink/egress.sock')),
                      ('list', lambda: os.listdir('/run/protolink'))):
    try:
        attempt()
        answers[name] = 'done'
    except OSError as error:
        answers[name] = error.errno
print(json.dumps(answers))
"""
    beneath = errno.EPERM if GVISOR else errno.EACCES  # gVisor's answer to a path beneath the directory
    assert await egress.probe(code) == {"connect": beneath, "stat": beneath, "list": errno.EACCES}
    await egress.allow([f"web.egress.test:{egress.servers.http_port}"], loopback=True)
    fetched = await egress.probe(FETCH, f"http://web.egress.test:{egress.servers.http_port}/hello.txt")
    assert fetched["status"] == 200


async def test_own_proxy_variables(egress):
    """A command sets its own proxy variables (HTTPS_PROXY and https_proxy naming an address of its choosing) to leave some other way than through the sandbox's proxy.

    Its own values are kept (a variable the command's environment names wins; the others are still added) and lead nowhere: the connection to that address fails in the kernel (no route) and the proxy sees nothing.
    """
    port = egress.servers.https_port
    await egress.allow([f"web.egress.test:{port}"], loopback=True)
    elsewhere = "http://203.0.113.1:3128"
    code = r"""
import json, os, sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=10)
    outcome = 'reached'
except OSError as error:
    outcome = str(getattr(error, 'reason', error))
print(json.dumps({'env': {k: v for k, v in os.environ.items() if k.lower().endswith('_proxy')}, 'outcome': outcome}))
"""
    answers = await egress.probe(code, f"https://web.egress.test:{port}/hello.txt",
                                 env={"HTTPS_PROXY": elsewhere, "https_proxy": elsewhere})
    relay = f"http://127.0.0.1:{EGRESS_PORT}"
    assert answers["env"] == {"HTTPS_PROXY": elsewhere, "https_proxy": elsewhere, "HTTP_PROXY": relay,
                              "http_proxy": relay, "ALL_PROXY": relay, "all_proxy": relay,
                              "NO_PROXY": "localhost,127.0.0.1,::1", "no_proxy": "localhost,127.0.0.1,::1"}
    assert "unreachable" in answers["outcome"] or "No route" in answers["outcome"], answers
    assert egress.events == []


#: Send each request head (latin-1 text) on a connection of its own to the proxy the variables
#: name, after a pause when asked, and give back the status line the proxy answers.
RAW = r"""
import json, os, socket, sys, time, urllib.parse
proxy = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
answers = []
for head in json.loads(sys.argv[1]):
    with socket.create_connection((proxy.hostname, proxy.port), timeout=60) as sock:
        sock.sendall(head.encode('latin-1'))
        answer = b''
        while b'\r\n' not in answer and (data := sock.recv(4096)):
            answer += data
        answers.append(answer.split(b'\r\n', 1)[0].decode())
print(json.dumps(answers))
"""


async def test_request_smuggling(egress):
    """Request heads that try to make the proxy and the allow-list disagree about the target, sent to the proxy from inside: CONNECT with an absolute-form URL, CONNECT with a second Host header naming another host, CONNECT whose Host names another host, a request line with two spaces, one with a NUL before a second target, and a plain-HTTP GET of an allowed URL whose Host header names another host.

    The first five are refused (400) with a denied event naming the fault; the GET goes to the URL's host only, and the server there sees the URL's authority as Host, never the smuggled one.
    """
    port = egress.servers.http_port
    target = f"web.egress.test:{port}"
    await egress.allow([target], loopback=True)
    heads = [f"CONNECT http://{target}/ HTTP/1.1\r\n\r\n",
             f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nHost: other.egress.test:{port}\r\n\r\n",
             f"CONNECT {target} HTTP/1.1\r\nHost: other.egress.test:{port}\r\n\r\n",
             f"CONNECT  {target} HTTP/1.1\r\n\r\n",
             f"CONNECT {target}\0other.egress.test:{port} HTTP/1.1\r\n\r\n",
             f"GET http://{target}/hello.txt HTTP/1.1\r\nHost: other.egress.test\r\n\r\n"]
    egress.servers.http.hosts.clear()
    answers = await egress.probe(RAW, json.dumps(heads))
    assert answers[:5] == ["HTTP/1.1 400 Bad Request"] * 5 and answers[5] == "HTTP/1.1 200 OK", answers
    reasons = egress.denied()
    assert len(reasons) == 5, reasons
    for reason, expected in zip(reasons, ("CONNECT wants an authority", "more than one Host header",
                                          "does not name the CONNECT target", "not three parts",
                                          "malformed request line"), strict=True):
        assert expected in reason, reasons
    assert egress.servers.http.hosts == [target]


async def test_slow_request_head(egress):
    """A command opens a connection to the proxy and sends the start of a CONNECT line, then nothing more (a slow client holding the proxy), while another connection asks for an allowed target.

    The other connection is served at once; the slow one is answered 408 and closed once the head time bound (1 s here) has passed, with a denied event saying so.
    """
    port = egress.servers.http_port
    await egress.allow([f"web.egress.test:{port}"], loopback=True, head_seconds=1.0)
    code = r"""
import json, os, socket, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])
line = b'CONNECT web.egress.test:' + sys.argv[1].encode() + b' HTTP/1.1\r\n'
slow = socket.create_connection((proxy.hostname, proxy.port), timeout=60)
slow.sendall(line)
with socket.create_connection((proxy.hostname, proxy.port), timeout=60) as quick:
    quick.sendall(line + b'\r\n')
    served = quick.recv(4096).split(b'\r\n', 1)[0].decode()
answer = b''
while data := slow.recv(4096):
    answer += data
print(json.dumps({'served': served, 'slow': answer.split(b'\r\n', 1)[0].decode()}))
"""
    answers = await egress.probe(code, str(port))
    assert answers == {"served": "HTTP/1.1 200 Connection established", "slow": "HTTP/1.1 408 Request Timeout"}
    assert egress.denied() == ["the request head was not complete within 1 seconds"]


async def test_dns_rebinding(egress):
    """A name whose resolver answers a public address first and loopback afterwards (DNS rebinding), fetched twice; and a name whose one answer mixes a public and a private address. Both names are allowed; loopback and private addresses are not.

    The first fetch is served from the public address the proxy resolved and checked (it connects to that address, never to the name again); the second resolution answers loopback and is refused (403, reason: loopback); the mixed answer is refused as a whole (reason: 10.0.0.1 is private). The proxy resolved once per connection and never connected to a denied address.
    """
    port = egress.servers.http_port
    await egress.allow([f"{REBINDING}:{port}", f"{MIXED}:{port}"])
    egress.names.rebinding_answers.clear()
    egress.names.connected.clear()
    fetches = [await egress.probe(FETCH, f"http://{host}:{port}/hello.txt") for host in (REBINDING, REBINDING, MIXED)]
    assert [fetch["status"] for fetch in fetches] == [200, 403, 403], fetches
    assert fetches[0]["body"] == HELLO
    assert egress.names.rebinding_answers == [PUBLIC, "127.0.0.1"] and egress.names.connected == [PUBLIC]
    reasons = egress.denied()
    assert len(reasons) == 2 and "127.0.0.1 is loopback" in reasons[0] and "10.0.0.1 is private" in reasons[1], reasons


# -- live changes and limits ---------------------------------------------------------------------


#: Download through the proxy variables until the body ends or the connection does.
DOWNLOAD = r"""
import json, sys, time, urllib.request
received = 0
try:
    with urllib.request.urlopen(sys.argv[1], timeout=60) as answer:
        while data := answer.read(256 * 1024):
            received += len(data)
    ending = 'eof'
except Exception as error:
    ending = type(error).__name__
print(json.dumps({'received': received, 'ending': ending, 'ended': time.time()}))
"""


async def test_deny_all_closes_an_open_download(egress):
    """`set_egress(DENY_ALL)` on a live sandbox while a command is downloading an endless stream through the proxy from the host's loopback server.

    The download is cut within a second of the call (the command's end of file and the server's broken connection, both measured from the call); the closed event says deny-all; a new connection is refused with 403 and a deny-all event.
    """
    server = egress.servers.http
    url = f"http://web.egress.test:{egress.servers.http_port}/stream"
    await egress.allow([f"web.egress.test:{egress.servers.http_port}"], loopback=True)
    server.ended.clear()
    download = asyncio.ensure_future(egress.run([PYTHON, "-c", DOWNLOAD, url], timeout=120))
    try:
        async with asyncio.timeout(60):
            while server.sent < 1 * MiB:  # it flows
                await asyncio.sleep(0.01)
        called = time.time()
        await egress.box.set_egress(DENY_ALL)
        result = await download
    finally:
        download.cancel()
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["received"] > 0 and outcome["ended"] - called < 1.0, (outcome, called)
    async with asyncio.timeout(10):
        while not server.ended:
            await asyncio.sleep(0.01)
    assert server.ended[0] - called < 1.0
    async with asyncio.timeout(10):
        while not any(event.kind == "closed" for event in egress.events):
            await asyncio.sleep(0.01)
    assert [event.reason for event in egress.events if event.kind == "closed"] == ["deny-all"], egress.events
    egress.events.clear()
    answers = await connect_through_proxy(egress, f"web.egress.test:{egress.servers.http_port}")
    assert set(answers.values()) == {"HTTP/1.1 403 Forbidden"} and egress.denied() == ["deny-all"]


FLOOD = r"""
import collections, json, os, selectors, socket, sys, time
target, count = sys.argv[1], int(sys.argv[2])
port = int(os.environ['HTTPS_PROXY'].rsplit(':', 1)[1])
selector = selectors.DefaultSelector()
outcomes, heads, held = collections.Counter(), {}, []
for _ in range(count):
    sock = socket.socket()
    sock.setblocking(False)
    sock.connect_ex(('127.0.0.1', port))
    selector.register(sock, selectors.EVENT_WRITE)
    heads[sock] = b''
deadline = time.monotonic() + 120
while heads and time.monotonic() < deadline:
    for key, mask in selector.select(1):
        sock = key.fileobj
        if mask & selectors.EVENT_WRITE:
            try:
                sock.send(f'CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n'.encode())
                selector.modify(sock, selectors.EVENT_READ)
            except OSError:
                outcomes['closed'] += 1
                selector.unregister(sock)
                del heads[sock]
            continue
        try:
            data = sock.recv(4096)
        except OSError:
            data = b''
        if data:
            heads[sock] += data
        if not data or b'\r\n' in heads[sock]:
            outcomes[heads[sock].split(b' ', 2)[1].decode() if data else 'closed'] += 1
            selector.unregister(sock)
            held.append(sock)  # a tunnel stays open until the command ends
            del heads[sock]
outcomes['unanswered'] = len(heads)
print(json.dumps(outcomes))
"""


async def test_a_thousand_connections_at_once(egress):
    """A command opens 1,000 connections to the proxy at once, each asking CONNECT to an allowed loopback server, and holds every tunnel it gets open.

    The limits hold: at most max_connections (64) tunnels are opened, the rest are refused (503 or 429 from the proxy, or closed at the bound of connections served at once: the host's, or the relay's under gVisor) with denied events; none hangs; the sandbox's other calls answer meanwhile and a new connection is allowed once the command ends.
    """
    port = egress.servers.http_port
    await egress.allow([f"web.egress.test:{port}"], loopback=True)
    flood = asyncio.ensure_future(egress.run([PYTHON, "-c", FLOOD, f"web.egress.test:{port}", "1000"], timeout=180))
    try:
        async with asyncio.timeout(60):
            while not egress.denied():
                await asyncio.sleep(0.01)
        assert (await egress.attacker.run(["/bin/echo", "meanwhile"])).stdout == "meanwhile\n"
        result = await flood
    finally:
        flood.cancel()
    outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    assert sum(outcomes.values()) == 1000 and outcomes["unanswered"] == 0, outcomes
    assert 0 < outcomes.get("200", 0) <= EgressLimits().max_connections, outcomes
    assert outcomes.get("503", 0) + outcomes.get("429", 0) + outcomes.get("closed", 0) >= 1000 - 64, outcomes
    assert all("too many connections" in reason for reason in egress.denied())
    await still_serves(egress.attacker)
    assert (await egress.probe(FETCH, f"http://web.egress.test:{port}/hello.txt"))["status"] == 200


async def test_byte_budget_stops_a_large_download(sandbox_image, tmp_path, box_root):
    """A command downloads 1 GiB (generated by the host's loopback server, never held in memory) through the proxy of a sandbox whose byte budget is 64 MiB.

    The download stops at the budget: the command receives less than 64 MiB and sees the connection end; the closed event says "byte budget"; further connections are refused for the rest of the sandbox's life.
    """
    events: list[EgressEvent] = []
    served, ro = tmp_path / "served", tmp_path / "ro"
    served.mkdir()
    ro.mkdir()
    with loopback_servers(served, ro) as servers:
        rule = f"web.egress.test:{servers.http_port}"
        policy = EgressPolicy.parse([rule], addresses=LOOPBACK, limits=EgressLimits(max_bytes=64 * MiB))
        async with egress_sandbox(sandbox_image, NamesForTests(), writable=[box_root], egress=policy,
                                  on_egress_event=events.append) as box:
            attacker = Attacker(box.backend, box_root)
            url = f"http://web.egress.test:{servers.http_port}/gib"
            result = await attacker.run([PYTHON, "-c", DOWNLOAD, url], timeout=300)
            outcome = json.loads(result.stdout.strip().splitlines()[-1])
            assert 32 * MiB < outcome["received"] < 64 * MiB, outcome
            closed = [event for event in events if event.kind == "closed"]
            assert len(closed) == 1 and closed[0].reason == "byte budget", events
            assert closed[0].bytes_up + closed[0].bytes_down <= 64 * MiB
            assert servers.http.sent < GiB
            again = await attacker.run([PYTHON, "-c", FETCH, f"http://web.egress.test:{servers.http_port}/ro"])
            assert json.loads(again.stdout)["status"] == 403 and "byte budget" in events[-1].reason


async def test_no_egress_by_default(attacker, sandbox):
    """A sandbox started without egress (the default): a command looks for the proxy variables, for a relay on the loopback port egress would use, and the host looks for the relay's socket.

    Nothing: no proxy variable in a command's environment, the port is closed (ECONNREFUSED), and no egress socket exists in the sandbox's channel directory.
    """
    code = r"""
import json, os, socket, sys
with socket.socket() as sock:
    answer = sock.connect_ex(('127.0.0.1', int(sys.argv[1])))
print(json.dumps({'variables': sorted(os.environ), 'connect': answer}))
"""
    answers = await attacker.probe(code, str(EGRESS_PORT))
    assert not set(answers["variables"]) & PROXY_VARIABLES and answers["connect"] == errno.ECONNREFUSED
    assert sandbox.address is not None and sandbox.egress is None
    assert not (Path(sandbox.address.removeprefix("unix://")).parent / "egress.sock").exists()
