"""Header-field and media-type rules shared by the built-ins that speak HTTP."""

from __future__ import annotations

import re

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # horizontal tab is allowed in values
_MEDIA_TYPE = re.compile(r"[\w.+-]+/[\w.+-]+\Z")
_TEXT_APPLICATION_TYPES = frozenset({
    "application/json", "application/xml", "application/javascript", "application/x-www-form-urlencoded",
})


def check_header(name: object, value: object) -> None:
    """ValueError unless ``name`` is an HTTP token and ``value`` a string without line breaks."""
    if not (isinstance(name, str) and isinstance(value, str) and _TOKEN.match(name)) or _CONTROL.search(value):
        raise ValueError(f"invalid header {name!r}")


def media_type(content_type: str | None) -> str | None:
    """The lowercase type/subtype of a Content-Type value, or None when absent or malformed."""
    value = (content_type or "").split(";", 1)[0].strip().lower()
    return value if _MEDIA_TYPE.match(value) else None


def is_json(media: str | None) -> bool:
    return media is not None and (media == "application/json" or media.endswith("+json"))


def is_text(media: str | None) -> bool:
    """True for textual media: text/*, JSON, XML, JavaScript, form data and +json/+xml types."""
    return media is not None and (
        media.startswith("text/") or media in _TEXT_APPLICATION_TYPES or media.endswith(("+json", "+xml"))
    )
