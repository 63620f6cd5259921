"""Hostile documents through read_document and search_document: each ends as a typed error or a
bounded result inside a supervised worker, and the sandbox serves the next call."""

from __future__ import annotations

import io
import os
import zipfile
import zlib
from pathlib import Path

import pytest

from protolink import Agent, AgentCard
from protolink.errors import DocumentError, SandboxLimitError
from protolink.tools.builtins import document_tools
from tests.pdfs import pdf

from .conftest import Attacker, figure, still_serves

pytestmark = pytest.mark.docker

#: The document tools' wall time where a timeout is one of the outcomes asserted (a parser that
#: may spin): short, so that a spinning parser ends the test quickly.
SPIN_SECONDS = 10
#: Their wall time where the outcome asserted is a limit other than time: a hang guard only. Such
#: a parse ends by the work it does (the PDF memory bomb spends 5-10 s of CPU before pypdf's work
#: limit ends it, which took 8-15 s with runc and up to 34 s under gVisor beside two CPU hogs); a
#: wall time near that made the outcome depend on the CPU the machine's load left the worker.
PARSE_GUARD = 180
FAILED = (DocumentError, SandboxLimitError, TimeoutError, ValueError)


def reader(attacker: Attacker, timeout_seconds: float = PARSE_GUARD) -> Agent:
    agent = Agent(AgentCard(name="reader"))
    for tool in document_tools(roots=[attacker.ws], backend=attacker.backend, timeout_seconds=timeout_seconds):
        agent.add_tool(tool)
    return agent


async def read(attacker: Attacker, name: str, data: bytes, timeout_seconds: float = PARSE_GUARD) -> dict:
    path = attacker.ws / name
    path.write_bytes(data)
    return await reader(attacker, timeout_seconds).call_tool("read_document", path=str(path))


def office(entries: dict[str, bytes], *, compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return out.getvalue()


CONTENT_TYPES = (b'<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/'
                 b'2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-'
                 b'package.relationships+xml"/><Override PartName="/word/document.xml" ContentType="application/'
                 b'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>')
RELS = (b'<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/'
        b'relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/'
        b'relationships/officeDocument" Target="word/document.xml"/></Relationships>')
W = b'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def docx(document_xml: bytes) -> bytes:
    return office({"[Content_Types].xml": CONTENT_TYPES, "_rels/.rels": RELS, "word/document.xml": document_xml})


def paragraph_document(body: bytes, prolog: bytes = b"") -> bytes:
    return (b'<?xml version="1.0" encoding="UTF-8"?>' + prolog + b"<w:document " + W + b"><w:body><w:p><w:r><w:t>"
            + body + b"</w:t></w:r></w:p></w:body></w:document>")


def lying_zip(name: str, real: bytes, declared: int) -> bytes:
    """A zip whose one entry declares ``declared`` expanded bytes but inflates to ``len(real)``."""
    raw = bytearray(office({name: real}))
    info = zipfile.ZipFile(io.BytesIO(raw)).infolist()[0]
    # Patch the uncompressed size in the local header (offset 22) and the central directory (offset 24).
    raw[info.header_offset + 22: info.header_offset + 26] = declared.to_bytes(4, "little")
    central = raw.rindex(b"PK\x01\x02")
    raw[central + 24: central + 28] = declared.to_bytes(4, "little")
    return bytes(raw)


async def test_zip_bomb(attacker):
    """A DOCX whose document.xml inflates from about 200 KiB to 200 MB (declared honestly in the archive).

    Refused before parsing: the declared expanded size is over max_archive_bytes (DocumentError).
    """
    bomb = docx(paragraph_document(b"a" * 200_000_000))
    figure("zip bomb DOCX", f"{len(bomb) / 1024:.0f} KiB on disk, 200 MB expanded")
    with pytest.raises(DocumentError, match="max_archive_bytes"):
        await read(attacker, "bomb.docx", bomb)
    await still_serves(attacker)


async def test_zip_bomb_lying_about_its_size(attacker):
    """An XLSX and a DOCX whose entries declare a few hundred bytes but inflate to 200 MB.

    The archive is read only up to its declared sizes (then a CRC mismatch): a typed error, the worker's memory bounded.
    """
    sheet = (b'<?xml version="1.0"?><worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
             b"<sheetData>" + b" " * 200_000_000 + b"</sheetData></worksheet>")
    for name, data in (("lying.xlsx", lying_zip("xl/worksheets/sheet1.xml", sheet, 300)),
                       ("lying.docx", lying_zip("word/document.xml", paragraph_document(b"b" * 200_000_000), 300))):
        with pytest.raises(FAILED):
            await read(attacker, name, data, SPIN_SECONDS)
    await still_serves(attacker)


async def test_billion_laughs_docx(attacker):
    """A DOCX whose document.xml defines ten levels of nested entities (a billion 'lol's) and uses the last.

    Entities are not expanded: the extraction is a typed error or a bounded result without the expansion.
    """
    entities = b'<!ENTITY lol0 "lol">' + b"".join(
        b'<!ENTITY lol%d "' % level + b"&lol%d;" % (level - 1) * 10 + b'">' for level in range(1, 10))
    document = paragraph_document(b"&lol9;", prolog=b"<!DOCTYPE w:document [" + entities + b"]>")
    try:
        result = await read(attacker, "laughs.docx", docx(document), SPIN_SECONDS)
    except FAILED:
        pass
    else:
        assert "lollol" not in str(result)
    await still_serves(attacker)


async def test_external_entity_docx(attacker):
    """A DOCX whose document.xml declares external entities (file:///etc/passwd, and an http URL) and uses them.

    Neither is fetched: the result never holds the file's content; no network is reached.
    """
    prolog = (b'<!DOCTYPE w:document [<!ENTITY xxe SYSTEM "file:///etc/passwd">'
              b'<!ENTITY web SYSTEM "http://169.254.169.254/latest/meta-data/">]>')
    try:
        result = await read(attacker, "xxe.docx", docx(paragraph_document(b"&xxe;&web;", prolog=prolog)),
                            SPIN_SECONDS)
    except FAILED:
        pass
    else:
        assert "root:" not in str(result)
    await still_serves(attacker)


def stream(content: bytes, compress: bool = False) -> bytes:
    data = zlib.compress(content, 9) if compress else content
    flate = b" /Filter /FlateDecode" if compress else b""
    return b"<< /Length %d%s >>\nstream\n" % (len(data), flate) + data + b"\nendstream"


PAGE = (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> "
        b"/XObject << /X1 5 0 R >> >> /Contents 4 0 R >>")
FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


@pytest.mark.parametrize("shape", ["kids-cycle", "self-drawing-form", "xref-prev-loop"])
async def test_pdf_that_loops(attacker, shape):
    """A PDF whose page tree contains itself, whose form XObject draws itself, or whose xref chain points back to itself.

    A typed error or a bounded result within the document timeout; the worker is replaced if it had to be killed.
    """
    if shape == "kids-cycle":
        data = pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [2 0 R 6 0 R] /Count 2 >>", FONT,
                    stream(b"BT /F1 12 Tf (loop) Tj ET"), b"<< >>", PAGE.replace(b"/Parent 2 0 R", b"/Parent 2 0 R")])
    elif shape == "self-drawing-form":
        form = (b"<< /Type /XObject /Subtype /Form /BBox [0 0 10 10] /Resources << /XObject << /X1 5 0 R >> "
                b"/Font << /F1 3 0 R >> >> /Length 24 >>\nstream\nBT /F1 1 Tf (x) Tj ET /X1 Do\nendstream")
        data = pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [6 0 R] /Count 1 >>", FONT,
                    stream(b"/X1 Do"), form, PAGE])
    else:
        body = pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>", FONT,
                    PAGE.replace(b"/Contents 4 0 R", b"/Contents 5 0 R").replace(b"/XObject << /X1 5 0 R >> ", b""),
                    stream(b"BT /F1 12 Tf (prev) Tj ET")])
        xref = body.rindex(b"startxref\n") + len(b"startxref\n")
        offset = int(body[xref:].split(b"\n")[0])
        data = body.replace(b"/Root 1 0 R >>", b"/Root 1 0 R /Prev %d >>" % offset)
    try:
        result = await read(attacker, f"{shape}.pdf", data, SPIN_SECONDS)
    except FAILED:
        pass
    else:
        assert len(str(result)) < 1 << 20
    await still_serves(attacker)


async def test_pdf_that_explodes_in_memory(attacker):
    """A PDF of about 100 KiB whose one content stream inflates to 72 MB of twelve million empty text operators (under pypdf's limits on stream sizes).

    Parsing the operators ends at pypdf's work limit for one stream, or at the worker's address-space limit (under gVisor, where it is half the memory): the call gets DocumentError or SandboxLimitError however long the parse takes on a loaded machine (its wall time is a hang guard), and the next call works.
    """
    operators = stream(b"BT /F1 12 Tf " + b"() Tj " * 12_000_000 + b"ET", compress=True)
    page = PAGE.replace(b"/XObject << /X1 5 0 R >> ", b"")
    data = pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [5 0 R] /Count 1 >>", FONT,
                operators, page])
    figure("PDF memory bomb", f"{len(data) / 1024:.0f} KiB on disk, 72 MB content stream of 12,000,000 operators")
    with pytest.raises((SandboxLimitError, DocumentError)) as error:
        await read(attacker, "explodes.pdf", data)
    figure("PDF memory bomb outcome", f"{type(error.value).__name__}: {error.value}")
    await still_serves(attacker)


async def test_two_gigabyte_csv_line(attacker):
    """A 2 GB CSV that is one line (a sparse file: it takes no disk), read and searched.

    Refused at once by the per-file cap (max_file_bytes, 8 MiB) before anything is read.
    """
    path = attacker.ws / "line.csv"
    with open(path, "wb") as sparse:
        sparse.truncate(2 * 10**9)
    agent = reader(attacker)
    with pytest.raises(ValueError, match="limit"):
        await agent.call_tool("read_document", path=str(path))
    with pytest.raises(ValueError, match="limit"):
        await agent.call_tool("search_document", path=str(path), query="x")
    path.unlink()
    await still_serves(attacker)


async def test_long_csv_line_under_the_cap(attacker):
    """A CSV of one 8,000,000-character line with a single quoted cell, just under the per-file cap.

    A typed DocumentError (the cell is over the CSV parser's field limit), never a result past max_output_chars.
    """
    try:
        result = await read(attacker, "long.csv", b'"' + b"x" * 8_000_000 + b'"\n')
    except DocumentError:
        pass
    else:
        assert result["truncated"] and len(str(result)) < 100_000
    await still_serves(attacker)


async def test_encrypted_documents(attacker):
    """An encrypted PDF (RC4, empty user password), a password-protected DOCX (OLE compound file) and a zip with encrypted entries.

    Each is refused with DocumentError: encrypted documents are unsupported.
    """
    encrypted_pdf = pdf([b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [] /Count 0 >>",
                         b"<< /Filter /Standard /V 1 /R 2 /O <" + b"00" * 32 + b"> /U <" + b"00" * 32 + b"> /P -4 >>"])
    encrypted_pdf = encrypted_pdf.replace(b"/Root 1 0 R >>", b"/Root 1 0 R /Encrypt 3 0 R /ID [<01> <01>] >>")
    ole = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + os.urandom(4096)
    flagged = bytearray(office({"word/document.xml": paragraph_document(b"secret")}))
    for header in (flagged.index(b"PK\x03\x04") + 6, flagged.rindex(b"PK\x01\x02") + 8):
        flagged[header] |= 0x1  # the "encrypted" flag bit
    for name, data in (("locked.pdf", encrypted_pdf), ("locked.docx", ole), ("flagged.docx", bytes(flagged))):
        with pytest.raises(DocumentError, match="encrypt"):
            await read(attacker, name, data)
    await still_serves(attacker)


async def test_document_search_is_bounded(attacker):
    """search_document over a 7 MB text file of 700,000 matching lines.

    At most max_results snippets come back, with truncated=True.
    """
    path: Path = attacker.ws / "matches.txt"
    path.write_bytes(b"needle in a haystack\n" * 350_000)
    result = await reader(attacker).call_tool("search_document", path=str(path), query="needle", max_results=100)
    assert len(result["matches"]) <= 100 and result["truncated"]
    await still_serves(attacker)


async def test_docx_that_explodes_in_memory(attacker):
    """A DOCX whose 30 MB document.xml (under max_archive_bytes) holds five million empty paragraphs.

    Building the XML tree exhausts the worker's address-space limit (or memory): SandboxLimitError or DocumentError; the next call works.
    """
    body = b"<w:p/>" * 5_000_000
    data = docx(b'<?xml version="1.0" encoding="UTF-8"?><w:document ' + W + b"><w:body>" + body
                + b"</w:body></w:document>")
    with pytest.raises((SandboxLimitError, DocumentError)) as error:
        await read(attacker, "explodes.docx", data)
    figure("DOCX memory bomb outcome", f"{type(error.value).__name__}: {error.value}")
    await still_serves(attacker)
