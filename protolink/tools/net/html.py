"""Readable text from HTML, with the standard library's ``html.parser``.

Scripts, styles and other non-content elements are dropped, entities are decoded, block elements
become line breaks and runs of whitespace collapse. Markup the parser cannot read raises
RuntimeError.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

_HIDDEN = frozenset({"script", "style", "noscript", "template", "svg", "math", "iframe", "object", "select"})
_BLOCKS = frozenset({
    "address", "article", "aside", "blockquote", "br", "caption", "dd", "details", "dialog", "div",
    "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5",
    "h6", "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table",
    "tr", "ul",
})
_CELLS = frozenset({"td", "th"})
_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
SNIFF_BYTES = 1024
#: The most characters of a title a tool returns (a page's, a search result's).
MAX_TITLE_CHARS = 300


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[str] = []
        self.title_pieces: list[str] = []
        self.title_done = False
        self._hidden = 0
        self._preformatted = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _HIDDEN:
            self._hidden += 1
        elif tag == "title" and not self.title_done:
            self._in_title = True
        elif tag in _BLOCKS:
            self.pieces.append("\n")
            self._preformatted += tag == "pre"
        elif tag in _CELLS:
            self.pieces.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _HIDDEN:
            self._hidden = max(self._hidden - 1, 0)
        elif tag == "title" and self._in_title:
            self._in_title = False
            self.title_done = True
        elif tag in _BLOCKS:
            self.pieces.append("\n")
            self._preformatted -= tag == "pre" and self._preformatted > 0

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title_pieces.append(data)
        elif not self._hidden:
            # Source line breaks are plain whitespace, except inside <pre>.
            self.pieces.append(data if self._preformatted else " ".join(data.splitlines()))


def _parse(markup: str) -> _TextParser:
    parser = _TextParser()
    try:
        parser.feed(markup)
        parser.close()
    except AssertionError as error:  # html.parser reports malformed declarations this way
        raise RuntimeError(f"could not parse the HTML: {error}") from None
    return parser


def collapse(text: str) -> str:
    """``text`` on one line with single spaces."""
    return " ".join(text.split())


def document_text(markup: str) -> tuple[str | None, str]:
    """The title (None when absent or blank) and the readable text of an HTML document."""
    parser = _parse(markup)
    lines = (collapse(line) for line in "".join(parser.pieces).splitlines())
    title = collapse("".join(parser.title_pieces)) or None
    return title, "\n".join(line for line in lines if line)


def fragment_text(markup: str) -> str:
    """Plain one-line text of a markup fragment such as a search excerpt."""
    return collapse("".join(_parse(markup).pieces))


def meta_charset(document: bytes) -> str | None:
    """The charset an HTML document declares in a ``<meta>`` tag near its start."""
    match = _META_CHARSET.search(document[:SNIFF_BYTES])
    return match.group(1).decode("ascii") if match else None
