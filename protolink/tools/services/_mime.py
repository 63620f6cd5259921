"""The one shape every built-in mail backend returns, and the MIME rules behind it.

A read returns selected headers, a snippet, a plain-text body capped at 20,000 characters,
``body_truncated``, ``has_attachments`` and ``html_body_omitted``. Text parts are decoded with
their declared charsets; HTML-only bodies are omitted and attachment content is never returned.
"""

from __future__ import annotations

import codecs
import email.header
import email.policy
import email.utils
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from email.message import EmailMessage, Message
from typing import Any

MAX_BODY_CHARS = 20_000
MAX_HEADER_CHARS = 2_000
MAX_SNIPPET_CHARS = 200
SELECTED_HEADERS = ("from", "to", "cc", "reply-to", "date", "subject", "message-id")


@dataclass
class Part:
    """One MIME node, whatever the service's representation of it."""

    content_type: str
    charset: str | None = None
    disposition: str | None = None
    filename: str | None = None
    data: bytes | None = None
    external_data: bool = False  # content stored elsewhere (Gmail attachmentId)
    children: list[Part] = field(default_factory=list)

    @property
    def is_attachment(self) -> bool:
        return (self.disposition == "attachment" or bool(self.filename)
                or self.content_type == "message/rfc822"
                or (self.external_data and not self.content_type.startswith("text/")))


def decode_text(data: bytes, charset: str | None) -> str:
    """Bytes decoded with a declared charset; unknown charsets fall back to UTF-8."""
    name = (charset or "utf-8").strip().strip('"').lower() or "utf-8"
    if name in ("us-ascii", "ascii"):
        name = "utf-8"  # many senders mislabel UTF-8 as ASCII; UTF-8 is a superset
    try:
        codecs.lookup(name)
    except LookupError:
        name = "utf-8"
    return data.decode(name, errors="replace")


def part_from_message(message: Message) -> Part:
    """A Part tree from a parsed RFC 5322 message (IMAP)."""
    part = Part(
        content_type=message.get_content_type(),
        charset=message.get_content_charset(),
        disposition=message.get_content_disposition(),
        filename=message.get_filename(),
    )
    if part.content_type == "message/rfc822":
        return part  # an attached message: counted, never opened
    if message.is_multipart():
        part.children = [part_from_message(child) for child in message.get_payload()]
    else:
        payload = message.get_payload(decode=True)
        part.data = payload if isinstance(payload, bytes) else None
    return part


def _leaves(part: Part) -> Iterator[Part]:
    """Leaf parts in order; an attachment is a leaf even when it is a container."""
    if part.children and not part.is_attachment:
        for child in part.children:
            yield from _leaves(child)
    elif not part.content_type.startswith("multipart/"):
        yield part


def body_fields(root: Part) -> dict[str, Any]:
    """``body``, ``body_truncated``, ``has_attachments`` and ``html_body_omitted`` of a tree.

    Inline text/plain parts make the body; attachments (and their text) are never included.
    """
    texts: list[str] = []
    has_html = has_attachments = False
    for part in _leaves(root):
        if part.is_attachment:
            has_attachments = True
        elif part.content_type == "text/plain" and part.data is not None:
            # MIME text travels with CRLF line ends; the body uses Python's newlines.
            texts.append(decode_text(part.data, part.charset).replace("\r\n", "\n"))
        elif part.content_type == "text/html":
            has_html = True
    body = "\n\n".join(text.strip("\n") for text in texts if text.strip())
    return {
        **capped_body(body),
        "has_attachments": has_attachments,
        "html_body_omitted": has_html and not texts,
    }


def capped_body(body: str) -> dict[str, Any]:
    return {"body": body[:MAX_BODY_CHARS], "body_truncated": len(body) > MAX_BODY_CHARS}


def snippet_of(text: str) -> str:
    """The first characters of a body, whitespace collapsed."""
    return " ".join(text.split())[:MAX_SNIPPET_CHARS]


def decode_header_value(value: str) -> str:
    """A raw header value with RFC 2047 encoded words decoded (as Gmail returns headers)."""
    try:
        return str(email.header.make_header(email.header.decode_header(value)))
    except (ValueError, LookupError, UnicodeError):
        return value


def selected_headers(pairs: Iterable[tuple[str, Any]]) -> dict[str, str | None]:
    """The selected headers from (name, value) pairs, first occurrence wins, values capped."""
    found: dict[str, str | None] = dict.fromkeys(SELECTED_HEADERS)
    for name, value in pairs:
        key = name.lower()
        if key in found and found[key] is None and str(value).strip():
            found[key] = " ".join(str(value).split())[:MAX_HEADER_CHARS]
    return {key.replace("-", "_"): value for key, value in found.items()}


def message_result(message_id: str, headers: Mapping[str, str | None], snippet: str,
                   fields: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    """The common read result."""
    return {"id": message_id, **extra, "headers": dict(headers), "snippet": snippet, **fields}


_DOMAIN = re.compile(r"@([^@]+)$")


def compose(sender: str, to: list[str], subject: str, body: str) -> EmailMessage:
    """A plain-text RFC 5322 message with a fresh Message-ID in the sender's domain."""
    message = EmailMessage(policy=email.policy.SMTP)
    message["From"] = sender
    message["To"] = ", ".join(to)
    message["Subject"] = subject
    if str(message["Subject"]) != subject:  # the header parser decoded something: not what was approved
        raise ValueError(f"subject {subject[:80]!r} would not be sent as written")
    message["Date"] = email.utils.formatdate(usegmt=True)
    match = _DOMAIN.search(sender)
    message["Message-ID"] = email.utils.make_msgid(domain=match.group(1) if match else None)
    message.set_content(body)
    return message
