"""IMAPEmail against real servers on loopback: Dovecot (IMAPS) and aiosmtpd (SMTPS, STARTTLS).

Dovecot is Debian's ``dovecot-imapd``, run as a throwaway instance: its own configuration,
passwd-file authentication and maildir in a temporary directory, a freshly generated
self-signed certificate (``openssl``), listening on 127.0.0.1. The backend trusts that
certificate through ``ssl_context``. A missing server fails these tests; they never skip.
"""

from __future__ import annotations

import asyncio
import imaplib
import itertools
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.mime.application import MIMEApplication
from email.mime.message import MIMEMessage
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, LoginPassword, syntax

from protolink.tools import IMAPEmail, MailBackendError, email_tools

from tests.descriptors import open_tcp_sockets
from tests.unit.tools.service_support import service_agent

USER, PASSWORD = "alice@example.com", "correct horse"
STARTUP_SECONDS = 30
_folders = itertools.count(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, alive=lambda: True) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and alive():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


# -- certificates -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Certificate:
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        """Trusts this certificate only, with host-name checking on (CN/SAN localhost)."""
        return ssl.create_default_context(cafile=str(self.cert))


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> Certificate:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is missing: apt-get install openssl", pytrace=False)
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return Certificate(cert, key)


# -- Dovecot ----------------------------------------------------------------------------------

@dataclass
class Dovecot:
    port: int
    certificate: Certificate

    def admin(self) -> imaplib.IMAP4_SSL:
        """A direct IMAP connection for arranging and inspecting the mailbox."""
        imap = imaplib.IMAP4_SSL("localhost", self.port, ssl_context=self.certificate.client_context(), timeout=30)
        imap.login(USER, PASSWORD)
        return imap

    def new_folder(self, *messages: bytes) -> str:
        """A fresh folder holding ``messages`` (UIDs ascending in the given order)."""
        name = f"Test{next(_folders)}"
        imap = self.admin()
        try:
            assert imap.create(name)[0] == "OK"
            for message in messages:
                assert imap.append(name, None, None, message)[0] == "OK"
        finally:
            imap.logout()
        return name

    def mail(self, folder: str, **options) -> IMAPEmail:
        options.setdefault("ssl_context", self.certificate.client_context())
        return IMAPEmail(USER, options.pop("password", PASSWORD), imap_host="localhost", imap_port=self.port,
                         mailbox=folder, **options)


DOVECOT_CONF = """\
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = required
ssl_cert = <{cert}
ssl_key = <{key}
auth_mechanisms = plain login
auth_failure_delay = 0
default_login_user = {login_user}
default_internal_user = {internal_user}
first_valid_uid = {uid}
mail_location = maildir:~/Maildir
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/passwd
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={root}/home/%u
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    port = 0
  }}
  inet_listener imaps {{
    port = {port}
    ssl = yes
  }}
}}
service anvil {{
  chroot =
}}
namespace inbox {{
  inbox = yes
  separator = /
  mailbox Drafts {{
    special_use = \\Drafts
    auto = create
  }}
}}
"""


@pytest.fixture(scope="module")
def dovecot(certificate: Certificate) -> Iterator[Dovecot]:
    binary = shutil.which("dovecot") or "/usr/sbin/dovecot"
    if not os.path.exists(binary):
        pytest.fail("dovecot is missing: apt-get install dovecot-imapd", pytrace=False)
    root = Path(tempfile.mkdtemp(prefix="protolink-dovecot-"))
    root.chmod(0o755)  # Dovecot's unprivileged processes must reach the tree
    if os.geteuid() == 0:  # Dovecot refuses root for its login and mail processes
        mail_user, login_user, internal_user = pwd.getpwnam("dovecot"), "dovenull", "dovecot"
    else:
        mail_user = pwd.getpwuid(os.geteuid())
        login_user = internal_user = mail_user.pw_name
    for sub in ("run", "state", "home"):
        (root / sub).mkdir()
    os.chown(root / "home", mail_user.pw_uid, mail_user.pw_gid)
    (root / "passwd").write_text(f"{USER}:{{PLAIN}}{PASSWORD}::::::\n")
    port = free_port()
    conf = root / "dovecot.conf"
    conf.write_text(DOVECOT_CONF.format(
        root=root, cert=certificate.cert, key=certificate.key, login_user=login_user,
        internal_user=internal_user, uid=mail_user.pw_uid, gid=mail_user.pw_gid, port=port))
    process = subprocess.Popen([binary, "-F", "-c", str(conf)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)
    try:
        try:
            wait_for_port(port, alive=lambda: process.poll() is None)
        except RuntimeError:
            log = (root / "dovecot.log").read_text() if (root / "dovecot.log").exists() else ""
            pytest.fail(f"dovecot did not start: {log[-2000:]}", pytrace=False)
        yield Dovecot(port, certificate)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)


# -- SMTP (aiosmtpd) --------------------------------------------------------------------------

@dataclass
class Outbox:
    """What an SMTP server saw: delivered envelopes, login attempts, and a DATA gate."""

    delivered: list[tuple[str, list[str], bytes]] = field(default_factory=list)
    logins: list[bytes] = field(default_factory=list)
    stall_data: bool = False
    data_reached: threading.Event = field(default_factory=threading.Event)

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("refuse"):
            return "550 5.1.1 <refused> private-routing-detail: no such user here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.data_reached.set()
        if self.stall_data:
            await asyncio.Event().wait()
        self.delivered.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 2.0.0 queued as private-queue-id"

    def authenticate(self, server, session, envelope, mechanism, auth_data) -> AuthResult:
        login = auth_data.login if isinstance(auth_data, LoginPassword) else b""
        self.logins.append(login)
        ok = isinstance(auth_data, LoginPassword) and (login, auth_data.password) == (
            USER.encode(), PASSWORD.encode())
        return AuthResult(success=ok, handled=False)  # unhandled: the server answers 535


class BrokenStartTLS(SMTP):
    """Advertises STARTTLS but refuses it; records any AUTH attempt."""

    @syntax("STARTTLS", when="tls_context")
    async def smtp_STARTTLS(self, arg: str) -> None:
        await self.push("454 4.7.0 TLS not available: private-tls-detail")

    @syntax("AUTH <mechanism>")
    async def smtp_AUTH(self, arg: str) -> None:
        self.event_handler.logins.append(b"attempted before TLS")
        await super().smtp_AUTH(arg)


class BrokenStartTLSController(Controller):
    def factory(self) -> SMTP:
        return BrokenStartTLS(self.handler, **self.SMTP_kwargs)


@dataclass
class SMTPServer:
    port: int
    outbox: Outbox
    starttls: bool


@pytest.fixture
def smtp_server(request, certificate: Certificate) -> Iterator[SMTPServer]:
    """An aiosmtpd server: ``implicit`` TLS (465 style), ``starttls`` (587 style) or ``broken``."""
    kind = getattr(request, "param", "implicit")
    outbox, port = Outbox(), free_port()
    common = {"hostname": "127.0.0.1", "port": port, "authenticator": outbox.authenticate,
              "server_hostname": "localhost", "ready_timeout": STARTUP_SECONDS}
    if kind == "implicit":
        controller = Controller(outbox, ssl_context=certificate.server_context(), auth_require_tls=False, **common)
    elif kind == "starttls":
        controller = Controller(outbox, tls_context=certificate.server_context(), require_starttls=True, **common)
    else:
        controller = BrokenStartTLSController(outbox, tls_context=certificate.server_context(), **common)
    controller.start()
    try:
        yield SMTPServer(port, outbox, starttls=kind != "implicit")
    finally:
        controller.stop()


def sending_mail(dovecot: Dovecot, smtp: SMTPServer, **options) -> IMAPEmail:
    return dovecot.mail("INBOX", smtp_host="localhost", smtp_port=smtp.port, smtp_starttls=smtp.starttls,
                        **options)


# -- messages -----------------------------------------------------------------------------

def nested_message() -> bytes:
    outer = MIMEMultipart("mixed")
    outer["From"] = "=?utf-8?q?J=C3=BCrg_M=C3=BCller?= <juerg@example.org>"
    outer["To"] = USER
    outer["Subject"] = "=?utf-8?q?Pr=C3=A4sentation_Q1?="
    outer["Date"] = "Fri, 28 Feb 2025 11:00:00 +0100"
    outer["Message-ID"] = "<nested-1@example.org>"
    alternative = MIMEMultipart("alternative")
    alternative.attach(MIMEText("Grüße aus Zürich!\nDie Präsentation ist im Anhang.\n", "plain", "iso-8859-1"))
    alternative.attach(MIMEText("<p>Grüße aus <b>Zürich</b>!</p>", "html", "utf-8"))
    outer.attach(alternative)
    notes = MIMEText("ATTACHED NOTES MUST NOT APPEAR", "plain", "utf-8")
    notes.add_header("Content-Disposition", "attachment", filename="notes.txt")
    outer.attach(notes)
    outer.attach(MIMEApplication(b"%PDF-1.4 fake", "pdf", Name="Q1.pdf"))
    forwarded = MIMEText("FORWARDED BODY MUST NOT APPEAR", "plain", "utf-8")
    forwarded["Subject"] = "Fwd"
    outer.attach(MIMEMessage(forwarded))
    return outer.as_bytes()


def simple_message(subject: str, body: str, *, charset: str = "utf-8", subtype: str = "plain",
                   sender: str = "ana@example.org") -> bytes:
    message = MIMEText(body, subtype, charset)
    message["From"], message["To"], message["Subject"] = sender, USER, subject
    return message.as_bytes()


def flags_of(dovecot: Dovecot, folder: str) -> list[bytes]:
    imap = dovecot.admin()
    try:
        imap.select(folder, readonly=True)
        _, data = imap.fetch("1:*", "(FLAGS)")
        return [item for item in data if isinstance(item, bytes)]
    finally:
        imap.logout()


def mail_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "protolink-mail"]


async def wait_until(predicate, what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.02)


# -- reading ----------------------------------------------------------------------------------

async def test_nested_mime_declared_charsets_and_attachments(dovecot: Dovecot):
    folder = dovecot.new_folder(nested_message(), simple_message("Privet", "Привет, мир", charset="koi8-r"))
    agent = service_agent(email_tools(dovecot.mail(folder)))
    listed = await agent.call_tool("list_email_messages")
    newest, oldest = [item["id"] for item in listed["items"]]
    nested = await agent.call_tool("read_email", message_id=oldest)
    assert nested["body"] == "Grüße aus Zürich!\nDie Präsentation ist im Anhang."
    assert nested["headers"]["subject"] == "Präsentation Q1"
    assert nested["headers"]["from"] == "Jürg Müller <juerg@example.org>"
    assert nested["headers"]["message_id"] == "<nested-1@example.org>"
    assert nested["has_attachments"] is True and nested["html_body_omitted"] is False
    assert nested["snippet"].startswith("Grüße aus Zürich! Die Präsentation")
    assert nested["mailbox"] == folder and nested["size_bytes"] > 0
    koi8 = await agent.call_tool("read_email", message_id=newest)
    assert koi8["body"] == "Привет, мир" and koi8["has_attachments"] is False


async def test_html_only_bodies_are_omitted(dovecot: Dovecot):
    folder = dovecot.new_folder(simple_message("Invoice", "<p>Invoice <b>#4711</b></p>", subtype="html"))
    mail = dovecot.mail(folder)
    [item] = (await mail.list_messages(query="", max_results=5, page_token=None))["items"]
    message = await mail.get_message(message_id=item["id"])
    assert message["body"] == "" and message["html_body_omitted"] is True
    assert message["headers"]["subject"] == "Invoice"


async def test_reads_do_not_mark_messages_seen(dovecot: Dovecot):
    folder = dovecot.new_folder(simple_message("Unread", "still unread"))
    mail = dovecot.mail(folder)
    [item] = (await mail.list_messages(query="", max_results=5, page_token=None))["items"]
    await mail.get_message(message_id=item["id"])
    [flags] = flags_of(dovecot, folder)
    assert b"\\Seen" not in flags


async def test_bodies_are_capped_at_twenty_thousand_characters(dovecot: Dovecot):
    folder = dovecot.new_folder(simple_message("Long", "ü" * 30_000))
    mail = dovecot.mail(folder)
    [item] = (await mail.list_messages(query="", max_results=5, page_token=None))["items"]
    message = await mail.get_message(message_id=item["id"])
    assert message["body"] == "ü" * 20_000 and message["body_truncated"] is True


async def test_messages_over_max_message_bytes_are_rejected(dovecot: Dovecot):
    folder = dovecot.new_folder(simple_message("Big", "x" * 50_000), simple_message("Small", "tiny"))
    mail = dovecot.mail(folder, max_message_bytes=10_000)
    big, small = reversed((await mail.list_messages(query="", max_results=5, page_token=None))["items"])
    with pytest.raises(MailBackendError, match="max_message_bytes=10000"):
        await mail.get_message(message_id=big["id"])
    assert (await mail.get_message(message_id=small["id"]))["body"] == "tiny"


async def test_pages_descend_by_uid_and_exclude_new_arrivals(dovecot: Dovecot):
    folder = dovecot.new_folder(*(simple_message(f"Message {n}", f"body {n}") for n in range(1, 6)))
    mail = dovecot.mail(folder)
    subjects = []
    page = await mail.list_messages(query="", max_results=2, page_token=None)
    imap = dovecot.admin()
    imap.append(folder, None, None, simple_message("Arrived later", "new"))
    imap.logout()
    while True:
        for item in page["items"]:
            subjects.append((await mail.get_message(message_id=item["id"]))["headers"]["subject"])
        if page["next_page_token"] is None:
            break
        page = await mail.list_messages(query="", max_results=2, page_token=page["next_page_token"])
    assert subjects == [f"Message {n}" for n in range(5, 0, -1)]


async def test_search_is_literal_text_across_headers_and_body(dovecot: Dovecot):
    folder = dovecot.new_folder(
        simple_message("Quarterly report", "numbers inside"),
        simple_message("Lunch", "the quarterly numbers are late"),
        simple_message("Other", "nothing", sender="quarterly-bot@example.org"),
        simple_message("Unrelated", "is:unread from:someone"),
    )
    mail = dovecot.mail(folder)

    async def subjects(query: str) -> list[str]:
        items = (await mail.list_messages(query=query, max_results=10, page_token=None))["items"]
        return [(await mail.get_message(message_id=i["id"]))["headers"]["subject"] for i in items]

    assert await subjects("QUARTERLY") == ["Other", "Lunch", "Quarterly report"]
    assert await subjects("is:unread") == ["Unrelated"]  # literal, not provider syntax
    assert await subjects('quarterly "quoted') == []
    with pytest.raises(ValueError, match="ASCII"):
        await mail.list_messages(query="Grüße", max_results=10, page_token=None)


async def test_changed_uidvalidity_rejects_stale_ids_and_page_tokens(dovecot: Dovecot):
    folder = dovecot.new_folder(simple_message("First", "one"), simple_message("Second", "two"))
    mail = dovecot.mail(folder)
    page = await mail.list_messages(query="", max_results=1, page_token=None)
    stale_id, stale_token = page["items"][0]["id"], page["next_page_token"]
    imap = dovecot.admin()
    assert imap.delete(folder)[0] == "OK" and imap.create(folder)[0] == "OK"
    imap.append(folder, None, None, simple_message("Impostor", "different message, same UID"))
    imap.logout()
    with pytest.raises(MailBackendError, match="UIDVALIDITY changed"):
        await mail.get_message(message_id=stale_id)
    with pytest.raises(MailBackendError, match="UIDVALIDITY changed"):
        await mail.list_messages(query="", max_results=1, page_token=stale_token)
    fresh = await mail.list_messages(query="", max_results=1, page_token=None)
    assert (await mail.get_message(message_id=fresh["items"][0]["id"]))["headers"]["subject"] == "Impostor"


async def test_ids_and_tokens_belong_to_one_account_folder_and_query(dovecot: Dovecot):
    folder = dovecot.new_folder(simple_message("A", "a"), simple_message("B", "b"))
    other = dovecot.new_folder(simple_message("C", "c"))
    page = await dovecot.mail(folder).list_messages(query="", max_results=1, page_token=None)
    with pytest.raises(ValueError, match="another account or folder"):
        await dovecot.mail(other).get_message(message_id=page["items"][0]["id"])
    with pytest.raises(ValueError, match="another query or page size"):
        await dovecot.mail(folder).list_messages(query="a", max_results=1, page_token=page["next_page_token"])
    with pytest.raises(ValueError, match="not issued by this IMAP backend"):
        await dovecot.mail(folder).get_message(message_id="18f3c2a9d4e5b601")


# -- authentication, TLS and errors -------------------------------------------------------------

async def test_password_callbacks_are_resolved_per_operation(dovecot: Dovecot):
    folder = dovecot.new_folder(simple_message("A", "a"))
    calls = []

    async def password() -> str:
        calls.append(1)
        return PASSWORD

    mail = dovecot.mail(folder, password=password)
    await mail.list_messages(query="", max_results=1, page_token=None)
    await mail.list_messages(query="", max_results=1, page_token=None)
    assert calls == [1, 1]


async def test_login_failure_carries_no_server_text(dovecot: Dovecot):
    mail = dovecot.mail("INBOX", password="wrong password")
    with pytest.raises(MailBackendError) as raised:
        await mail.list_messages(query="", max_results=1, page_token=None)
    assert str(raised.value) == "IMAP login failed: refused by the server"
    assert raised.value.__context__ is None and raised.value.__cause__ is None


async def test_the_default_context_validates_the_server_certificate(dovecot: Dovecot):
    mail = dovecot.mail("INBOX", ssl_context=None)
    with pytest.raises(MailBackendError, match="TLS certificate verification failed"):
        await mail.list_messages(query="", max_results=1, page_token=None)


async def test_a_missing_mailbox_is_a_clear_error(dovecot: Dovecot):
    with pytest.raises(MailBackendError, match="could not open mailbox 'Nowhere'"):
        await dovecot.mail("Nowhere").list_messages(query="", max_results=1, page_token=None)


# -- drafts -------------------------------------------------------------------------------------

async def test_drafts_are_appended_with_the_draft_flag(dovecot: Dovecot):
    drafts = dovecot.new_folder()
    agent = service_agent(email_tools(dovecot.mail("INBOX", drafts_mailbox=drafts), allow_write=True))
    result = await agent.call_tool("create_email_draft", to=["bob@example.com"], subject="Lunch?",
                                   body="Friday at noon?")
    assert result["status"] == "drafted" and result["mailbox"] == drafts
    assert result["message_id"].startswith("<") and result["message_id"].endswith("@example.com>")
    imap = dovecot.admin()
    imap.select(drafts, readonly=True)
    _, data = imap.fetch("1", "(FLAGS BODY.PEEK[HEADER.FIELDS (MESSAGE-ID FROM TO)])")
    imap.logout()
    assert b"\\Draft" in data[0][0]
    assert result["message_id"].encode() in data[0][1] and b"From: alice@example.com" in data[0][1]


async def test_drafts_need_an_existing_folder(dovecot: Dovecot):
    mail = dovecot.mail("INBOX", drafts_mailbox="Does-Not-Exist")
    with pytest.raises(MailBackendError, match="must be an existing folder"):
        await mail.create_draft(to=["bob@example.com"], subject="Hi", body="Hello")
    imap = dovecot.admin()
    assert b"Does-Not-Exist" not in b" ".join(imap.list()[1])
    imap.logout()


async def test_composed_messages_over_max_message_bytes_are_refused_before_connecting():
    mail = IMAPEmail(USER, PASSWORD, imap_host="127.0.0.1", imap_port=free_port(), drafts_mailbox="Drafts",
                     max_message_bytes=1000)
    with pytest.raises(MailBackendError, match="composed message is .* over max_message_bytes=1000"):
        await mail.create_draft(to=["bob@example.com"], subject="Hi", body="x" * 2000)


# -- sending ------------------------------------------------------------------------------------

@pytest.mark.parametrize("smtp_server", ["implicit", "starttls"], indirect=True)
async def test_sending_over_tls_reports_accepted_recipients(dovecot: Dovecot, smtp_server: SMTPServer):
    agent = service_agent(email_tools(sending_mail(dovecot, smtp_server), allow_send=True))
    result = await agent.call_tool("send_email", to=["bob@example.com", "carol@example.com"],
                                   subject="Grüße", body="Hallo\nzusammen")
    assert result["status"] == "accepted" and result["refused"] == []
    assert result["accepted"] == ["bob@example.com", "carol@example.com"]
    [(sender, recipients, content)] = smtp_server.outbox.delivered
    assert sender == USER and recipients == ["bob@example.com", "carol@example.com"]
    assert result["message_id"].encode() in content
    assert smtp_server.outbox.logins == [USER.encode()]


async def test_partial_refusal_reports_codes_without_server_text(dovecot: Dovecot, smtp_server: SMTPServer):
    mail = sending_mail(dovecot, smtp_server)
    result = await mail.send_message(to=["bob@example.com", "refuse-me@example.com"], subject="Hi", body="Hello")
    assert result["status"] == "partially_accepted"
    assert result["accepted"] == ["bob@example.com"]
    assert result["refused"] == [{"address": "refuse-me@example.com", "code": 550}]
    assert "private" not in str(result)
    [(_, recipients, _)] = smtp_server.outbox.delivered
    assert recipients == ["bob@example.com"]


async def test_all_recipients_refused_is_rejected(dovecot: Dovecot, smtp_server: SMTPServer):
    result = await sending_mail(dovecot, smtp_server).send_message(
        to=["refuse-a@example.com", "refuse-b@example.com"], subject="Hi", body="Hello")
    assert result["status"] == "rejected" and result["accepted"] == []
    assert [r["code"] for r in result["refused"]] == [550, 550]
    assert smtp_server.outbox.delivered == []


@pytest.mark.parametrize("smtp_server", ["broken"], indirect=True)
async def test_failed_starttls_refuses_to_log_in(dovecot: Dovecot, smtp_server: SMTPServer):
    mail = sending_mail(dovecot, smtp_server)
    with pytest.raises(MailBackendError, match="STARTTLS failed .*refusing to log in") as raised:
        await mail.send_message(to=["bob@example.com"], subject="Hi", body="Hello")
    assert "private" not in str(raised.value)
    assert smtp_server.outbox.logins == [] and smtp_server.outbox.delivered == []


async def test_starttls_is_required_when_not_offered(dovecot: Dovecot):
    plain_port, outbox = free_port(), Outbox()
    controller = Controller(outbox, hostname="127.0.0.1", port=plain_port, authenticator=outbox.authenticate,
                            auth_require_tls=False)  # offers AUTH in plaintext, no STARTTLS
    controller.start()
    try:
        mail = dovecot.mail("INBOX", smtp_host="localhost", smtp_port=plain_port, smtp_starttls=True)
        with pytest.raises(MailBackendError, match="does not offer STARTTLS; refusing to log in"):
            await mail.send_message(to=["bob@example.com"], subject="Hi", body="Hello")
    finally:
        controller.stop()
    assert outbox.logins == [] and outbox.delivered == []


async def test_smtp_login_failure_sends_nothing(dovecot: Dovecot, smtp_server: SMTPServer):
    mail = sending_mail(dovecot, smtp_server, password="wrong password")
    with pytest.raises(MailBackendError, match="^SMTP login failed: refused by the server \\(code 535\\)$"):
        await mail.send_message(to=["bob@example.com"], subject="Hi", body="Hello")
    assert smtp_server.outbox.delivered == []


# -- cancellation -------------------------------------------------------------------------------

class ScriptedIMAPS:
    """A misbehaving IMAP server for ``connections`` TLS connections, one after another;
    records what the client sends.

    Without ``answer`` it never greets. With it, it greets and answers each command line with
    ``answer(tag, command)``'s lines.
    """

    def __init__(self, certificate: Certificate, answer=None, connections: int = 1) -> None:
        self.connections = connections
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.context, self.answer = certificate.server_context(), answer
        self.handshaken, self.closed = threading.Event(), threading.Event()
        self.received = b""
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        for _ in range(self.connections):
            self._converse(self.listener.accept()[0])
        self.closed.set()
        self.listener.close()

    def _converse(self, connection: socket.socket) -> None:
        with self.context.wrap_socket(connection, server_side=True) as tls:
            self.handshaken.set()
            if self.answer is not None:
                tls.sendall(b"* OK [CAPABILITY IMAP4rev1] scripted\r\n")
            try:
                while chunk := tls.recv(4096):
                    self.received += chunk
                    if self.answer is not None:
                        tag, _, command = chunk.decode().strip().partition(" ")
                        tls.sendall(b"".join(line + b"\r\n" for line in self.answer(tag, command.upper())))
            except OSError:
                pass

    def mail(self, certificate: Certificate, **options) -> IMAPEmail:
        return IMAPEmail(USER, PASSWORD, imap_host="localhost", imap_port=self.port,
                         ssl_context=certificate.client_context(), **options)


def oversized_literal(tag: str, command: str) -> list[bytes]:
    """A server that understates RFC822.SIZE, then announces a 50 MB literal."""
    if command.startswith("EXAMINE"):
        return [b"* OK [UIDVALIDITY 7] ok", f"{tag} OK [READ-ONLY] done".encode()]
    if command.startswith("UID SEARCH"):
        return [b"* SEARCH 5", f"{tag} OK done".encode()]
    if "RFC822.SIZE" in command:
        return [b"* 1 FETCH (UID 5 RFC822.SIZE 10)", f"{tag} OK done".encode()]
    if "BODY.PEEK" in command:
        return [b"* 1 FETCH (UID 5 BODY[]<0> {50000000}"]
    return [f"{tag} OK done".encode()]


async def test_a_server_literal_over_max_message_bytes_is_refused_unread(certificate: Certificate):
    server = ScriptedIMAPS(certificate, oversized_literal, connections=2)
    mail = server.mail(certificate, max_message_bytes=1000)
    [item] = (await mail.list_messages(query="", max_results=5, page_token=None))["items"]
    with pytest.raises(MailBackendError, match="50000000 bytes at once, over max_message_bytes=1000"):
        await mail.get_message(message_id=item["id"])
    assert b"BODY.PEEK[]<0.1001>" in server.received


async def test_cancellation_interrupts_a_blocked_imap_read_before_login(certificate: Certificate):
    server = ScriptedIMAPS(certificate)
    mail = server.mail(certificate, timeout_seconds=600)
    task = asyncio.create_task(mail.list_messages(query="", max_results=5, page_token=None))
    await asyncio.to_thread(server.handshaken.wait, STARTUP_SECONDS)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(server.closed.wait, STARTUP_SECONDS), "the socket was not interrupted"
    assert server.received == b""  # never logged in
    await wait_until(lambda: not mail_threads(), "the worker thread to end")


async def test_cancellation_interrupts_an_smtp_submission(dovecot: Dovecot, smtp_server: SMTPServer):
    smtp_server.outbox.stall_data = True
    mail = sending_mail(dovecot, smtp_server, timeout_seconds=600)
    agent = service_agent(email_tools(mail, allow_send=True))
    task = asyncio.create_task(agent.call_tool("send_email", to=["bob@example.com"], subject="Hi", body="Hello"))
    await asyncio.to_thread(smtp_server.outbox.data_reached.wait, STARTUP_SECONDS)
    await wait_until(lambda: mail_threads(), "the worker thread")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: not mail_threads(), "the worker thread to end after its socket was shut down")
    assert smtp_server.outbox.delivered == []


async def test_the_tool_timeout_interrupts_a_stalled_server(certificate: Certificate):
    server = ScriptedIMAPS(certificate)
    mail = server.mail(certificate, timeout_seconds=600)
    agent = service_agent(email_tools(mail, timeout_seconds=0.5))
    with pytest.raises(TimeoutError):
        await agent.call_tool("list_email_messages")
    assert await asyncio.to_thread(server.closed.wait, STARTUP_SECONDS)
    assert server.received == b""


async def test_connections_are_closed_after_every_operation(dovecot: Dovecot, certificate: Certificate):
    folder = dovecot.new_folder(simple_message("A", "a"))
    mail = dovecot.mail(folder)
    await mail.list_messages(query="", max_results=1, page_token=None)  # warm imports and contexts
    before = open_tcp_sockets()
    for _ in range(3):
        [item] = (await mail.list_messages(query="", max_results=1, page_token=None))["items"]
        await mail.get_message(message_id=item["id"])
        with pytest.raises(MailBackendError):
            await dovecot.mail(folder, password="wrong").get_message(message_id=item["id"])
        server = ScriptedIMAPS(certificate)
        task = asyncio.create_task(server.mail(certificate).list_messages(query="", max_results=1, page_token=None))
        await asyncio.to_thread(server.handshaken.wait, STARTUP_SECONDS)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(server.closed.wait, STARTUP_SECONDS)
    await wait_until(lambda: not mail_threads(), "the worker threads to end")
    await wait_until(lambda: open_tcp_sockets() <= before, "every mail connection to close")
    assert open_tcp_sockets() == before
