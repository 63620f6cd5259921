"""A tiny stand-in for an IMAP server and an SMTP submission server, for examples only.

It speaks just enough IMAP4rev1 (LOGIN, EXAMINE, UID SEARCH, UID FETCH, APPEND) and ESMTP
(EHLO, AUTH PLAIN, MAIL, RCPT, DATA) over TLS on 127.0.0.1 for IMAPEmail to run offline, with a
demonstration certificate from tests/fixtures/services. It is not a mail server and checks no
password: the test suite runs IMAPEmail against Dovecot and aiosmtpd instead.
"""

from __future__ import annotations

import base64
import itertools
import re
import socketserver
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

DEMO_TLS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "services"
_TOKEN = re.compile(r'"((?:[^"\\]|\\.)*)"|(\([^)]*\))|(\S+)')
_uidvalidities = itertools.count(1_700_000_000)


@dataclass
class Folder:
    uidvalidity: int = field(default_factory=lambda: next(_uidvalidities))
    messages: dict[int, bytes] = field(default_factory=dict)
    flags: dict[int, str] = field(default_factory=dict)

    def add(self, raw: bytes, flags: str = "") -> int:
        uid = max(self.messages, default=0) + 1
        self.messages[uid], self.flags[uid] = raw, flags
        return uid


def _tokens(line: str) -> list[str]:
    found = []
    for match in _TOKEN.finditer(line):
        quoted, group, atom = match.groups()
        found.append(re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else group or atom)
    return found


class LoopbackMail:
    """IMAP and SMTP on 127.0.0.1 over TLS, holding folders in memory; a context manager."""

    def __init__(self) -> None:
        self.folders = {"INBOX": Folder(), "Drafts": Folder()}
        self.submitted: list[tuple[str, list[str], bytes]] = []
        self._server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_context.load_cert_chain(DEMO_TLS / "loopback-demo-cert.pem", DEMO_TLS / "loopback-demo-key.pem")
        self._servers = [self._server(_IMAPHandler), self._server(_SMTPHandler)]
        self.imap_port, self.smtp_port = (s.server_address[1] for s in self._servers)

    def client_context(self) -> ssl.SSLContext:
        """What an application passes as ssl_context to trust this demonstration certificate."""
        return ssl.create_default_context(cafile=str(DEMO_TLS / "loopback-demo-cert.pem"))

    def recreate(self, name: str) -> None:
        """Delete and recreate a folder: it gets a new UIDVALIDITY and UIDs start again at 1."""
        self.folders[name] = Folder()

    def _server(self, handler: type[socketserver.StreamRequestHandler]) -> socketserver.ThreadingTCPServer:
        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        server.mail = self  # type: ignore[attr-defined]
        return server

    def __enter__(self) -> LoopbackMail:
        for server in self._servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()


class _TLSHandler(socketserver.StreamRequestHandler):
    def setup(self) -> None:
        self.mail: LoopbackMail = self.server.mail  # type: ignore[attr-defined]
        self.request = self.mail._server_context.wrap_socket(self.request, server_side=True)
        self.connection = self.request
        super().setup()

    def send(self, *lines: str | bytes) -> None:
        for line in lines:
            self.wfile.write(line if isinstance(line, bytes) else line.encode() + b"\r\n")
        self.wfile.flush()

    def lines(self):
        while line := self.rfile.readline(65536):
            yield line.decode("latin-1").rstrip("\r\n")


class _IMAPHandler(_TLSHandler):
    def handle(self) -> None:
        self.send("* OK [CAPABILITY IMAP4rev1 AUTH=PLAIN] loopback demo IMAP ready")
        folder: Folder | None = None
        for line in self.lines():
            tag, *words = _tokens(line) or ["*"]
            command = " ".join(words[:2]).upper() if words[:1] == ["UID"] else (words[:1] or [""])[0].upper()
            if command == "CAPABILITY":
                self.send("* CAPABILITY IMAP4rev1 AUTH=PLAIN", f"{tag} OK done")
            elif command == "LOGIN":
                self.send(f"{tag} OK logged in")
            elif command == "EXAMINE" and words[1] in self.mail.folders:
                folder = self.mail.folders[words[1]]
                self.send(f"* {len(folder.messages)} EXISTS", f"* OK [UIDVALIDITY {folder.uidvalidity}] ok",
                          f"{tag} OK [READ-ONLY] examined")
            elif command == "UID SEARCH" and folder is not None:
                self.send(f"* SEARCH {' '.join(map(str, self._search(folder, words[2:])))}", f"{tag} OK done")
            elif command == "UID FETCH" and folder is not None:
                self._fetch(folder, int(words[2]), words[3])
                self.send(f"{tag} OK done")
            elif command == "APPEND":
                self._append(tag, words)
            elif command == "LOGOUT":
                self.send("* BYE", f"{tag} OK bye")
                return
            else:
                self.send(f"{tag} NO not supported by the demo server")

    @staticmethod
    def _search(folder: Folder, criteria: list[str]) -> list[int]:
        uids = sorted(folder.messages)
        while criteria:
            key = criteria.pop(0).upper()
            if key == "UID":
                low, high = map(int, criteria.pop(0).split(":"))
                uids = [uid for uid in uids if low <= uid <= high]
            elif key == "TEXT":
                needle = criteria.pop(0).lower().encode()
                uids = [uid for uid in uids if needle in folder.messages[uid].lower()]
        return uids

    def _fetch(self, folder: Folder, uid: int, items: str) -> None:
        if uid not in folder.messages:
            return
        sequence, raw = sorted(folder.messages).index(uid) + 1, folder.messages[uid]
        if "RFC822.SIZE" in items:
            self.send(f"* {sequence} FETCH (UID {uid} RFC822.SIZE {len(raw)})")
        else:
            limit = int(re.search(r"<0\.(\d+)>", items).group(1))  # type: ignore[union-attr]
            data = raw[:limit]
            self.send(f"* {sequence} FETCH (UID {uid} BODY[]<0> {{{len(data)}}}", data, ")\r\n".encode())

    def _append(self, tag: str, words: list[str]) -> None:
        size = int(words[-1].strip("{}"))
        self.send("+ ready for the message")
        raw = self.rfile.read(size)
        self.rfile.readline()
        target = self.mail.folders.get(words[1])
        if target is None:
            self.send(f"{tag} NO [TRYCREATE] no such folder")
            return
        uid = target.add(raw, flags=words[2] if words[2].startswith("(") else "")
        self.send(f"{tag} OK [APPENDUID {target.uidvalidity} {uid}] appended")


class _SMTPHandler(_TLSHandler):
    def handle(self) -> None:
        self.send("220 localhost loopback demo ESMTP")
        sender, recipients = "", []
        for line in self.lines():
            verb = line.split(" ", 1)[0].upper()
            if verb == "EHLO":
                self.send("250-localhost", "250-AUTH PLAIN", "250 8BITMIME")
            elif verb == "AUTH":
                base64.b64decode(line.split()[-1])  # the demo accepts any credentials
                self.send("235 2.7.0 authenticated")
            elif verb == "MAIL":
                sender, recipients = line.split(":", 1)[1].split()[0].strip("<>"), []
                self.send("250 2.1.0 ok")
            elif verb == "RCPT":
                address = line.split(":", 1)[1].strip().strip("<>")
                if address.startswith("nobody@"):
                    self.send("550 5.1.1 demo server refuses nobody@")
                else:
                    recipients.append(address)
                    self.send("250 2.1.5 ok")
            elif verb == "DATA":
                self.send("354 end with <CRLF>.<CRLF>")
                body = bytearray()
                while (chunk := self.rfile.readline(65536)) not in (b".\r\n", b""):
                    body += chunk
                self.mail.submitted.append((sender, recipients, bytes(body)))
                self.send("250 2.0.0 queued")
            elif verb == "QUIT":
                self.send("221 2.0.0 bye")
                return
            else:
                self.send("250 ok")
