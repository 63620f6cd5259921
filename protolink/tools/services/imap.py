"""IMAPEmail: a standard mailbox over implicit-TLS IMAP, with optional SMTP submission.

Standard library only (``imaplib``, ``smtplib``, ``ssl``, ``email``). Each operation runs on its
own worker thread with fresh connections that are closed when it ends. Cancellation shuts the
established sockets down, which interrupts a blocked read; workers also check for cancellation
before logging in and before every write. Errors never carry the server's response text.
"""

from __future__ import annotations

import asyncio
import email
import hashlib
import imaplib
import re
import smtplib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from email.message import EmailMessage
from typing import Any, TypeVar

from protolink.errors import ProtoLinkError
from protolink.tools.builtins.email import check_address

from ._credentials import SecretSource, check_secret_source, resolve_secret
from ._mime import (
    body_fields,
    compose,
    decode_header_value,
    message_result,
    part_from_message,
    selected_headers,
    snippet_of,
)

__all__ = ["IMAPEmail", "MailBackendError"]

T = TypeVar("T")
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")
_UID = re.compile(rb"\bUID (\d+)")
_SIZE = re.compile(rb"\bRFC822\.SIZE (\d+)")


class MailBackendError(ProtoLinkError, RuntimeError):
    """An IMAP or SMTP operation failed. Messages never include the server's response text."""


class _Canceled(Exception):
    """The awaiting task was canceled; the worker stops before its next step."""


def _interrupt(sock: socket.socket) -> None:
    try:  # the plain socket method: SSLSocket.shutdown would also reset its TLS state
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


class _Operation:
    """State shared by an awaiting task and its worker: the sockets to interrupt, the stage."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._canceled = False
        self.stage = "starting"

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self._canceled:
                _interrupt(sock)

    def cancel(self) -> None:
        with self._lock:
            self._canceled = True
            for sock in self._sockets:
                _interrupt(sock)

    def check(self) -> None:
        if self._canceled:
            raise _Canceled


def _wrap(operation: _Operation, raw: socket.socket, context: ssl.SSLContext,
          host: str) -> ssl.SSLSocket:
    """TLS over ``raw``; both sockets are interruptible, and ``raw`` is closed if TLS fails."""
    operation.attach(raw)
    try:
        wrapped = context.wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise
    operation.attach(wrapped)
    return wrapped


class _IMAP(imaplib.IMAP4_SSL):
    """IMAP4_SSL whose socket is registered with the operation as soon as it exists, and which
    refuses server literals larger than ``max_literal`` bytes before reading them."""

    def __init__(self, operation: _Operation, host: str, port: int, context: ssl.SSLContext,
                 timeout: float, max_literal: int) -> None:
        self._operation = operation
        self._max_literal = max_literal
        super().__init__(host, port, ssl_context=context, timeout=timeout)

    def _create_socket(self, timeout: float | None) -> socket.socket:
        raw = imaplib.IMAP4._create_socket(self, timeout)
        return _wrap(self._operation, raw, self.ssl_context, self.host)

    def read(self, size: int) -> bytes:  # imaplib reads each {size} literal through here
        if size > self._max_literal:
            raise MailBackendError(f"the IMAP server sent {size} bytes at once, over "
                                   f"max_message_bytes={self._max_literal - 1}")
        return super().read(size)


class _SMTP(smtplib.SMTP):
    def __init__(self, operation: _Operation, host: str, port: int, timeout: float) -> None:
        self._operation = operation
        super().__init__(host, port, timeout=timeout)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock = super()._get_socket(host, port, timeout)
        self._operation.attach(sock)
        return sock


class _SMTPSSL(smtplib.SMTP_SSL):
    def __init__(self, operation: _Operation, host: str, port: int, context: ssl.SSLContext,
                 timeout: float) -> None:
        self._operation = operation
        super().__init__(host, port, context=context, timeout=timeout)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        raw = smtplib.SMTP._get_socket(self, host, port, timeout)
        return _wrap(self._operation, raw, self.context, self._host)


def _quote(text: str) -> str:
    """An IMAP quoted string (the caller has checked ``text`` is one line of ASCII)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _ascii_line(value: str, name: str, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > 1000 or (
            not _PRINTABLE_ASCII.fullmatch(value) if value else not allow_empty):
        raise ValueError(f"{name} must be one line of printable ASCII"
                         + ("" if allow_empty else " and not empty"))
    return value


def _failure_kind(error: BaseException) -> str:
    """A failure described without the remote side's words."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return "TLS certificate verification failed"
    if isinstance(error, ssl.SSLError):
        return "TLS error"
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, socket.gaierror):
        return "host name lookup failed"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, (imaplib.IMAP4.abort, smtplib.SMTPServerDisconnected, ConnectionError, EOFError)):
        return "connection closed"
    if isinstance(error, (imaplib.IMAP4.error, smtplib.SMTPException)):
        code = getattr(error, "smtp_code", None)
        return f"refused by the server (code {code})" if isinstance(code, int) else "refused by the server"
    if isinstance(error, OSError):
        return "network error"
    return f"unexpected {type(error).__name__}"


class IMAPEmail:
    """A mailbox over IMAP (implicit TLS) with optional SMTP submission; implements EmailBackend.

    ``password`` is a string or a no-argument sync/async callback, resolved once per operation.
    SMTP uses implicit TLS (port 465) unless ``smtp_starttls=True`` (port 587 style), where
    STARTTLS must succeed before login; there is no plaintext fallback. ``ssl_context`` replaces
    the default context (certificate and host-name validation). ``sender`` defaults to the
    username. ``drafts_mailbox`` must name an existing folder. ``timeout_seconds`` bounds each
    socket operation; ``max_message_bytes`` caps fetched and composed messages.

    IDs and page tokens carry the account/folder identity and UIDVALIDITY: after UIDVALIDITY
    changes they are rejected instead of pointing at another message. Reads EXAMINE the mailbox
    and fetch with ``BODY.PEEK[]``, so nothing is marked seen.
    """

    query_help = ("literal ASCII text matched in the headers and body (not Gmail or raw IMAP "
                  "search syntax); empty lists all messages")

    def __init__(self, username: str, password: SecretSource, *, imap_host: str,
                 smtp_host: str | None = None, imap_port: int = 993, smtp_port: int = 465,
                 smtp_starttls: bool = False, sender: str | None = None, mailbox: str = "INBOX",
                 drafts_mailbox: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 timeout_seconds: float = 15, max_message_bytes: int = 2097152) -> None:
        self.username = _ascii_line(username, "username")
        self._password = check_secret_source(password, "password")
        self.imap_host = _ascii_line(imap_host, "imap_host")
        self.smtp_host = None if smtp_host is None else _ascii_line(smtp_host, "smtp_host")
        for port, name in ((imap_port, "imap_port"), (smtp_port, "smtp_port")):
            if not isinstance(port, int) or not 0 < port < 65536:
                raise ValueError(f"{name} must be a TCP port number")
        self.imap_port, self.smtp_port, self.smtp_starttls = imap_port, smtp_port, bool(smtp_starttls)
        if sender is not None:
            self.sender: str | None = check_address(sender, "sender")
        else:
            self.sender = username if _is_address(username) else None
        # International folder names are given in IMAP modified UTF-7, which is ASCII.
        self.mailbox = _ascii_line(mailbox, "mailbox")
        self.drafts_mailbox = (None if drafts_mailbox is None
                               else _ascii_line(drafts_mailbox, "drafts_mailbox"))
        if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
            raise TypeError("ssl_context must be an ssl.SSLContext")
        self._ssl_context = ssl_context
        if not timeout_seconds > 0:
            raise ValueError("timeout_seconds must be > 0")
        if not isinstance(max_message_bytes, int) or max_message_bytes <= 0:
            raise ValueError("max_message_bytes must be a positive integer")
        self.timeout_seconds, self.max_message_bytes = float(timeout_seconds), max_message_bytes
        identity = "\n".join((self.username, self.imap_host.lower(), str(imap_port), self.mailbox))
        self._identity = hashlib.sha256(identity.encode()).hexdigest()[:16]

    def describe_target(self) -> dict[str, Any]:
        return {"service": "IMAP/SMTP", "account": self.username,
                "imap": f"{self.imap_host}:{self.imap_port}", "mailbox": self.mailbox,
                "drafts_mailbox": self.drafts_mailbox, "sender": self.sender,
                "smtp": None if self.smtp_host is None else f"{self.smtp_host}:{self.smtp_port}"
                + (" (STARTTLS)" if self.smtp_starttls else " (TLS)")}

    def check_compose(self, *, send: bool) -> None:
        """ValueError when drafts (``send=False``) or sending are not configured."""
        if self.sender is None:
            raise ValueError("IMAPEmail needs sender= (a bare ASCII address) because the username "
                             "is not an address")
        if send and self.smtp_host is None:
            raise ValueError("IMAPEmail needs smtp_host= to send")
        if not send and self.drafts_mailbox is None:
            raise ValueError("IMAPEmail needs drafts_mailbox= (an existing folder) to create drafts")

    # -- EmailBackend ------------------------------------------------------------------

    async def list_messages(self, *, query: str, max_results: int,
                            page_token: str | None) -> dict[str, Any]:
        text = _ascii_line(query, "the IMAP search text", allow_empty=True)
        binding = hashlib.sha256(f"{max_results}\n{text}".encode()).hexdigest()[:12]
        validity = before = None
        if page_token is not None:
            validity, before = self._parse_page_token(page_token, binding)
        password = await self._resolve_password()
        return await self._in_worker(
            lambda op: self._list(op, password, text, max_results, binding, validity, before))

    async def get_message(self, *, message_id: str) -> dict[str, Any]:
        validity, uid = self._parse_message_id(message_id)
        password = await self._resolve_password()
        return await self._in_worker(lambda op: self._read(op, password, message_id, validity, uid))

    async def create_draft(self, *, to: list[str], subject: str, body: str) -> dict[str, Any]:
        self.check_compose(send=False)
        message, data = self._compose(to, subject, body)
        password = await self._resolve_password()
        await self._in_worker(lambda op: self._append_draft(op, password, data))
        return {"status": "drafted", "mailbox": self.drafts_mailbox, "message_id": message["Message-ID"]}

    async def send_message(self, *, to: list[str], subject: str, body: str) -> dict[str, Any]:
        self.check_compose(send=True)
        message, _ = self._compose(to, subject, body)
        password = await self._resolve_password()
        refused = await self._in_worker(lambda op: self._submit(op, password, message, to))
        accepted = [address for address in to if address not in refused]
        status = "accepted" if not refused else "partially_accepted" if accepted else "rejected"
        return {"status": status, "message_id": message["Message-ID"], "accepted": accepted,
                "refused": [{"address": address, "code": code} for address, code in refused.items()]}

    # -- identifiers -------------------------------------------------------------------

    def _fields(self, value: str, name: str, count: int) -> list[str]:
        """The fields after ``imap:<identity>:``; ValueError for foreign or malformed values."""
        parts = value.split(":")
        if len(parts) != count + 2 or parts[0] != "imap" or not parts[-1].isdigit() or not parts[2].isdigit():
            raise ValueError(f"{name} was not issued by this IMAP backend; use values returned by "
                             "list_email_messages")
        if parts[1] != self._identity:
            raise ValueError(f"{name} belongs to another account or folder")
        return parts[2:]

    def _parse_message_id(self, message_id: str) -> tuple[int, int]:
        """(UIDVALIDITY, UID) of a message ID."""
        validity, uid = self._fields(message_id, "message_id", 2)
        return int(validity), int(uid)

    def _parse_page_token(self, token: str, binding: str) -> tuple[int, int]:
        """(UIDVALIDITY, UID bound) of a page token issued for the same query and page size."""
        validity, token_binding, before = self._fields(token, "page_token", 3)
        if token_binding != binding:
            raise ValueError("page_token belongs to another query or page size: keep them, or start "
                             "again without a token")
        return int(validity), int(before)

    def _message_id(self, validity: int, uid: int) -> str:
        return f"imap:{self._identity}:{validity}:{uid}"

    def _page_token(self, validity: int, binding: str, before: int) -> str:
        return f"imap:{self._identity}:{validity}:{binding}:{before}"

    # -- plumbing ----------------------------------------------------------------------

    async def _resolve_password(self) -> str:
        password = await resolve_secret(self._password, "password")
        if not _PRINTABLE_ASCII.fullmatch(password):
            raise ValueError("the password must be printable ASCII for IMAP/SMTP login")
        return password

    def _compose(self, to: list[str], subject: str, body: str) -> tuple[EmailMessage, bytes]:
        message = compose(self.sender, to, subject, body)  # type: ignore[arg-type]
        data = message.as_bytes()
        if len(data) > self.max_message_bytes:
            raise MailBackendError(f"the composed message is {len(data)} bytes, over "
                                   f"max_message_bytes={self.max_message_bytes}")
        return message, data

    async def _in_worker(self, work: Callable[[_Operation], T]) -> T:
        """Run ``work`` on a fresh thread; cancellation interrupts its sockets."""
        operation = _Operation()
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[tuple[bool, Any]] = loop.create_future()

        def deliver(result: tuple[bool, Any]) -> None:
            if not outcome.done():
                outcome.set_result(result)

        def main() -> None:
            result = _guarded(operation, work)
            try:
                loop.call_soon_threadsafe(deliver, result)
            except RuntimeError:  # the loop closed after the caller gave up
                pass

        threading.Thread(target=main, name="protolink-mail", daemon=True).start()
        try:
            ok, value = await outcome
        except asyncio.CancelledError:
            operation.cancel()
            raise
        if not ok:
            raise value
        return value

    def _context(self) -> ssl.SSLContext:
        return self._ssl_context or ssl.create_default_context()

    @contextmanager
    def _imap(self, op: _Operation, password: str) -> Iterator[_IMAP]:
        op.stage = "connecting to the IMAP server"
        imap = _IMAP(op, self.imap_host, self.imap_port, self._context(), self.timeout_seconds,
                     max_literal=self.max_message_bytes + 1)
        try:
            op.check()
            op.stage = "IMAP login"
            imap.login(_quote(self.username), password)
            yield imap
            op.stage = "IMAP logout"
            _close_quietly(imap.logout)
        finally:
            _close_quietly(imap.shutdown)

    def _examine(self, op: _Operation, imap: _IMAP, expected: int | None = None) -> int:
        """Select the mailbox read-only (EXAMINE); its UIDVALIDITY, checked against ``expected``."""
        op.stage = "opening the mailbox"
        status, _ = imap.select(_quote(self.mailbox), readonly=True)
        if status != "OK":
            raise MailBackendError(f"the IMAP server could not open mailbox {self.mailbox!r}")
        _, data = imap.response("UIDVALIDITY")
        value = data[0] if data else None
        if not isinstance(value, bytes) or not value.strip().isdigit():
            raise MailBackendError("the IMAP server reported no UIDVALIDITY for the mailbox")
        validity = int(value)
        if expected is not None and validity != expected:
            raise MailBackendError("the mailbox's UIDVALIDITY changed: this ID or page token is stale; "
                                   "list messages again")
        return validity

    def _list(self, op: _Operation, password: str, text: str, max_results: int, binding: str,
              expected: int | None, before: int | None) -> dict[str, Any]:
        with self._imap(op, password) as imap:
            validity = self._examine(op, imap, expected)
            criteria = []
            if before is not None:
                if before <= 1:
                    return {"items": [], "next_page_token": None}
                criteria += ["UID", f"1:{before - 1}"]
            if text:
                criteria += ["TEXT", _quote(text)]
            op.stage = "IMAP search"
            status, data = imap.uid("SEARCH", *(criteria or ["ALL"]))
            if status != "OK":
                raise MailBackendError("the IMAP server refused the search")
            found = b" ".join(item for item in data if isinstance(item, bytes)).split()
            uids = sorted({int(uid) for uid in found if uid.isdigit()}, reverse=True)
        page = uids[:max_results]
        more = len(uids) > max_results
        return {"items": [{"id": self._message_id(validity, uid)} for uid in page],
                "next_page_token": self._page_token(validity, binding, page[-1]) if more else None}

    def _read(self, op: _Operation, password: str, message_id: str, expected: int,
              uid: int) -> dict[str, Any]:
        with self._imap(op, password) as imap:
            self._examine(op, imap, expected)
            op.stage = "IMAP fetch"
            size = self._fetch_size(imap, uid)
            if size > self.max_message_bytes:
                raise MailBackendError(f"the message is {size} bytes, over "
                                       f"max_message_bytes={self.max_message_bytes}")
            raw = self._fetch_bytes(imap, uid)
        message = email.message_from_bytes(raw)
        fields = body_fields(part_from_message(message))
        headers = selected_headers((name, decode_header_value(str(value))) for name, value in message.items())
        return message_result(message_id, headers, snippet_of(fields["body"]), fields,
                              mailbox=self.mailbox, size_bytes=size)

    def _fetch_size(self, imap: _IMAP, uid: int) -> int:
        status, data = imap.uid("FETCH", str(uid), "(RFC822.SIZE)")
        for text, _ in _fetched(data if status == "OK" else [], uid):
            if match := _SIZE.search(text):
                return int(match.group(1))
        raise MailBackendError("the message is no longer in the mailbox")

    def _fetch_bytes(self, imap: _IMAP, uid: int) -> bytes:
        # A partial fetch bounds what the server can send even if RFC822.SIZE was wrong.
        status, data = imap.uid("FETCH", str(uid), f"(BODY.PEEK[]<0.{self.max_message_bytes + 1}>)")
        for _, literal in _fetched(data if status == "OK" else [], uid):
            if literal is not None:
                if len(literal) > self.max_message_bytes:
                    raise MailBackendError(f"the message is larger than "
                                           f"max_message_bytes={self.max_message_bytes}")
                return literal
        raise MailBackendError("the message is no longer in the mailbox")

    def _append_draft(self, op: _Operation, password: str, data: bytes) -> None:
        with self._imap(op, password) as imap:
            op.check()
            op.stage = "appending the draft"
            status, _ = imap.append(_quote(self.drafts_mailbox), r"(\Draft)",  # type: ignore[arg-type]
                                    imaplib.Time2Internaldate(time.time()), data)
            if status != "OK":
                raise MailBackendError(f"the IMAP server refused the draft; drafts_mailbox "
                                       f"{self.drafts_mailbox!r} must be an existing folder")

    def _submit(self, op: _Operation, password: str, message: EmailMessage,
                to: list[str]) -> dict[str, int]:
        """Submit over SMTP; the refused recipients with their reply codes."""
        op.stage = "connecting to the SMTP server"
        context = self._context()
        host: str = self.smtp_host  # type: ignore[assignment]  # check_compose(send=True) ran
        if self.smtp_starttls:
            smtp: smtplib.SMTP = _SMTP(op, host, self.smtp_port, self.timeout_seconds)
        else:
            smtp = _SMTPSSL(op, host, self.smtp_port, context, self.timeout_seconds)
        try:
            if self.smtp_starttls:
                op.stage = "SMTP STARTTLS"
                smtp.ehlo()
                if not smtp.has_extn("starttls"):
                    raise MailBackendError("the SMTP server does not offer STARTTLS; refusing to log in")
                try:
                    smtp.starttls(context=context)
                except (smtplib.SMTPException, ssl.SSLError, OSError) as error:
                    failure = MailBackendError(f"SMTP STARTTLS failed ({_failure_kind(error)}); "
                                               "refusing to log in")
                else:
                    failure = None
                if failure is not None:
                    raise failure
                op.attach(smtp.sock)
            op.check()
            op.stage = "SMTP login"
            smtp.login(self.username, password)
            op.check()
            op.stage = "SMTP submission"
            try:
                refused = smtp.send_message(message, from_addr=self.sender, to_addrs=to)
            except smtplib.SMTPRecipientsRefused as error:
                refused = error.recipients
            op.stage = "SMTP quit"
            _close_quietly(smtp.quit)
        finally:
            _close_quietly(smtp.close)
        return {address: int(reply[0]) for address, reply in refused.items()}


def _guarded(op: _Operation, work: Callable[[_Operation], T]) -> tuple[bool, Any]:
    """Run ``work``; foreign errors become MailBackendError without server text or context."""
    try:
        return True, work(op)
    except (MailBackendError, _Canceled) as error:
        return False, error
    except Exception as error:  # translated once, here
        kind = _failure_kind(error)
    return False, MailBackendError(f"{op.stage} failed: {kind}")


def _close_quietly(close: Callable[[], Any]) -> None:
    try:
        close()
    except (OSError, imaplib.IMAP4.error, smtplib.SMTPException):
        pass


def _fetched(data: list[Any], uid: int) -> Iterator[tuple[bytes, bytes | None]]:
    """(response text, literal) of each FETCH response in imaplib's ``data`` that is for ``uid``.

    A literal's response text continues in the bytes item after it (where UID may come).
    """
    for index, item in enumerate(data):
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], bytes):
            after = data[index + 1] if index + 1 < len(data) else b""
            text, literal = item[0] + b" " + (after if isinstance(after, bytes) else b""), item[1]
        elif isinstance(item, bytes):
            text, literal = item, None
        else:
            continue
        match = _UID.search(text)
        if match and int(match.group(1)) == uid:
            yield text, literal if isinstance(literal, bytes) else None


def _is_address(value: str) -> bool:
    try:
        check_address(value)
    except ValueError:
        return False
    return True
