"""read_document and search_document against a backend, on real generated documents.

Every document lives under ``workspace``; the tools run through an ordinary Agent with the
backend under test, so the same suite holds for the host and for a sandbox.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import re
import zipfile
from pathlib import Path

import docx
import openpyxl
import pytest
from msoffcrypto.format.ooxml import OOXMLFile
from pypdf import PdfReader, PdfWriter
from reportlab.lib.pagesizes import A4
from reportlab.pdfgen import canvas

from protolink import Agent, AgentCard, CapabilityPolicy, RunContext
from protolink.errors import BudgetExceededError, PolicyDeniedError, ToolArgumentError
from protolink.tools import document_tools


def make_agent(workspace: Path, backend, **limits) -> Agent:
    agent = Agent(AgentCard(name="reader", description="reads documents"))
    for tool in document_tools(roots=[workspace], backend=backend, **limits):
        agent.add_tool(tool)
    return agent


async def read(agent: Agent, path: Path) -> dict:
    return await agent.call_tool("read_document", path=str(path))


def pdf_bytes(pages: list[list[str]]) -> bytes:
    """A real PDF drawn with reportlab: one page per list of lines."""
    buffer = io.BytesIO()
    drawing = canvas.Canvas(buffer, pagesize=A4)
    for lines in pages:
        y = 800
        for line in lines:
            drawing.drawString(72, y, line)
            y -= 16
        drawing.showPage()
    drawing.save()
    return buffer.getvalue()


def cid_font_pdf(text: str) -> bytes:
    """A PDF whose one page shows ``text`` in a composite (Type0, Identity-H) font: its strings
    are UTF-16BE, as in most PDFs of non-Latin text."""
    content = b"BT /F1 12 Tf 72 720 Td <%s> Tj ET" % text.encode("utf-16-be").hex().encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> >>"
        b" /Contents 4 0 R >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
        b"<< /Type /Font /Subtype /Type0 /BaseFont /Plain /Encoding /Identity-H /DescendantFonts [6 0 R] >>",
        b"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /Plain"
        b" /CIDSystemInfo << /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    table_at = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, table_at)
    return bytes(out)


def docx_bytes() -> bytes:
    document = docx.Document()
    document.add_heading("Quarterly report", level=1)
    document.add_paragraph("Revenue grew in every region.")
    document.add_paragraph("")
    table = document.add_table(rows=2, cols=3)
    for row, values in zip(table.rows, [("Region", "Q1", "Q2"), ("North", "10", "12")], strict=True):
        for cell, value in zip(row.cells, values, strict=True):
            cell.text = value
    nested = table.rows[1].cells[2].add_table(rows=1, cols=1)
    nested.rows[0].cells[0].text = "nested, not top-level"
    document.add_paragraph("Closing remarks.")
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def xlsx_bytes(*, cached_formula_value: str | None) -> bytes:
    """Two worksheets; B1 of the first holds the formula =A1+1, with or without a cached value."""
    workbook = openpyxl.Workbook()
    sales = workbook.active
    sales.title = "Sales"
    sales["A1"] = 41
    sales["B1"] = "=A1+1"
    sales.append(["North", 2.5, True, datetime.datetime(2024, 3, 1, 9, 30)])
    sales["A5"] = "after a gap"
    costs = workbook.create_sheet("Costs")
    costs.append(["Rent", 1200])
    buffer = io.BytesIO()
    workbook.save(buffer)
    if cached_formula_value is None:
        return buffer.getvalue()
    return rewrite_entry(buffer.getvalue(), "xl/worksheets/sheet1.xml",
                         lambda xml: xml.replace(b"<f>A1+1</f><v></v>",
                                                 b"<f>A1+1</f><v>" + cached_formula_value.encode() + b"</v>"))


def rewrite_entry(archive: bytes, name: str, change) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(archive))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info.filename, change(data) if info.filename == name else data)
    return out.getvalue()


def encrypted_pdf(plain: bytes) -> bytes:
    """``plain`` encrypted (RC4-128, an empty user password), under a file ID drawn anew."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(plain)))
    writer.encrypt(user_password="", owner_password="owner", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def encrypted_office(data: bytes) -> bytes:
    out = io.BytesIO()
    OOXMLFile(io.BytesIO(data)).encrypt("secret", out)
    return out.getvalue()


def cell_chars(result: dict) -> int:
    return sum(len(s.get("text", "")) + sum(map(len, s.get("cells", []))) for s in result["sections"])


# -- text formats ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, content", [
    ("notes.txt", "plain notes\nsecond line\n"),
    ("README.md", "# Title\n\n<script>alert(1)</script>\n"),
    ("guide.rst", "Title\n=====\n\n.. include:: /etc/passwd\n"),
    ("server.log", "2024-01-01 ERROR boom\n"),
    ("data.json", '{"a": 1, "a": 2, "b": NaN}\n'),
    ("config.yaml", "anchor: &a [1, 2]\nalias: *a\ntag: !!python/object:os.system ls\n"),
    ("feed.xml", '<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>\n<x>&e;</x>\n'),
])
async def test_text_formats_are_returned_verbatim_without_interpretation(workspace, backend, name, content):
    path = workspace / name
    path.write_text(content, encoding="utf-8")
    result = await read(make_agent(workspace, backend), path)
    assert result["metadata"] == {"path": str(path), "format": result["metadata"]["format"],
                                  "input_bytes": len(content.encode())}
    assert result["sections"] == [{"location": {"line": 1}, "text": content}]
    assert result["truncated"] is False


async def test_text_metadata_names_the_format_from_the_extension(workspace, backend):
    agent = make_agent(workspace, backend)
    formats = {}
    for name in ("a.TXT", "b.markdown", "c.yml", "d.xml"):
        (workspace / name).write_text("x", encoding="utf-8")
        formats[name] = (await read(agent, workspace / name))["metadata"]["format"]
    assert formats == {"a.TXT": "txt", "b.markdown": "md", "c.yml": "yaml", "d.xml": "xml"}


async def test_invalid_utf8_and_binary_text_are_refused(workspace, backend):
    agent = make_agent(workspace, backend)
    (workspace / "latin1.txt").write_bytes("café".encode("latin-1"))
    (workspace / "binary.log").write_bytes(b"abc\0def")
    with pytest.raises(ValueError, match="UTF-8"):
        await read(agent, workspace / "latin1.txt")
    with pytest.raises(ValueError, match="NUL"):
        await read(agent, workspace / "binary.log")


# -- CSV / TSV ------------------------------------------------------------------------------


async def test_csv_rows_have_string_cells_and_one_based_row_locations(workspace, backend):
    path = workspace / "people.csv"
    path.write_text('name,age,note\nAda,36,"likes, commas"\n\nBob,7,"two\nlines"\n', encoding="utf-8")
    result = await read(make_agent(workspace, backend), path)
    assert result["metadata"]["format"] == "csv"
    assert result["sections"] == [
        {"location": {"row": 1}, "cells": ["name", "age", "note"]},
        {"location": {"row": 2}, "cells": ["Ada", "36", "likes, commas"]},
        {"location": {"row": 4}, "cells": ["Bob", "7", "two\nlines"]},
    ]
    assert result["truncated"] is False


async def test_tsv_splits_on_tabs(workspace, backend):
    path = workspace / "table.tsv"
    path.write_text("a\tb,c\n1\t2\n", encoding="utf-8")
    result = await read(make_agent(workspace, backend), path)
    assert [s["cells"] for s in result["sections"]] == [["a", "b,c"], ["1", "2"]]


async def test_rows_are_limited_to_100_columns_and_the_rows_after_them_are_kept(workspace, backend):
    path = workspace / "wide.csv"
    path.write_text(",".join(f"c{i}" for i in range(1, 151)) + "\nnext,row\n", encoding="utf-8")
    agent = make_agent(workspace, backend)
    result = await read(agent, path)
    assert [s["cells"] for s in result["sections"]] == [[f"c{i}" for i in range(1, 101)], ["next", "row"]]
    assert result["truncated"] is True
    found = await agent.call_tool("search_document", path=str(path), query="next")
    assert len(found["matches"]) == 1


async def test_trailing_empty_cells_do_not_count_against_the_column_limit(workspace, backend):
    path = workspace / "padded.csv"
    path.write_text("a,b" + "," * 200 + "\n", encoding="utf-8")
    result = await read(make_agent(workspace, backend), path)
    assert result["sections"][0]["cells"] == ["a", "b"]
    assert result["truncated"] is False


async def test_text_and_cell_characters_share_max_output_chars(workspace, backend):
    path = workspace / "big.csv"
    path.write_text("\n".join(f"{'x' * 30},{'y' * 30}" for _ in range(50)), encoding="utf-8")
    result = await read(make_agent(workspace, backend, max_output_chars=1000), path)
    assert cell_chars(result) == 1000
    assert result["truncated"] is True
    assert result["sections"][-1]["cells"][-1] in ("y" * 10, "x" * 10)


async def test_long_text_is_cut_at_max_output_chars(workspace, backend):
    path = workspace / "long.txt"
    path.write_text("z" * 5000, encoding="utf-8")
    result = await read(make_agent(workspace, backend, max_output_chars=1234), path)
    assert result["sections"] == [{"location": {"line": 1}, "text": "z" * 1234}]
    assert result["truncated"] is True


async def test_max_sections_bounds_the_sections(workspace, backend):
    path = workspace / "rows.csv"
    path.write_text("".join(f"{i}\n" for i in range(1, 31)), encoding="utf-8")
    agent = make_agent(workspace, backend, max_sections=10)
    result = await read(agent, path)
    assert [s["location"]["row"] for s in result["sections"]] == list(range(1, 11))
    assert result["truncated"] is True


async def test_a_document_that_exactly_fits_is_not_truncated(workspace, backend):
    path = workspace / "fits.csv"
    path.write_text("ab,cd\nef,gh\n", encoding="utf-8")
    result = await read(make_agent(workspace, backend, max_output_chars=8, max_sections=2), path)
    assert len(result["sections"]) == 2
    assert result["truncated"] is False


# -- PDF ------------------------------------------------------------------------------------


async def test_pdf_pages_are_sections_located_by_page_number(workspace, backend):
    path = workspace / "report.pdf"
    path.write_bytes(pdf_bytes([["Introduction to widgets"], [], ["Widget pricing table", "Total 42"]]))
    result = await read(make_agent(workspace, backend), path)
    assert result["metadata"] == {"path": str(path), "format": "pdf", "input_bytes": path.stat().st_size}
    pages = {s["location"]["page"]: s["text"] for s in result["sections"]}
    assert set(pages) == {1, 3}, "an empty page contributes no section"
    assert "Introduction to widgets" in pages[1]
    assert "Widget pricing table" in pages[3] and "Total 42" in pages[3]
    assert result["truncated"] is False


async def test_pdf_text_in_a_composite_font_is_decoded(workspace, backend):
    """Its strings are UTF-16BE: the sandbox's parser finds that codec however the server's
    interpreter was installed (its files may be unreadable to the command user)."""
    path = workspace / "cid.pdf"
    path.write_bytes(cid_font_pdf("Grüße, Ωμέγα, 東京"))
    result = await read(make_agent(workspace, backend), path)
    assert [section["text"] for section in result["sections"]] == ["Grüße, Ωμέγα, 東京"]


async def test_encrypted_pdf_is_refused(workspace, backend):
    """Refused as encrypted whatever the file ID each encryption draws (pypdf reads an ID that
    starts like UTF-16 as UTF-16 text: without that codec it lost the trailer and took the
    encrypted pages for plain ones)."""
    plain = pdf_bytes([["confidential"]])
    agent = make_agent(workspace, backend)
    for number in range(40):
        path = workspace / f"locked-{number}.pdf"
        path.write_bytes(encrypted_pdf(plain))
        with pytest.raises(ValueError, match="PDF document is encrypted"):
            await read(agent, path)


async def test_an_encrypted_pdf_whose_last_trailer_drops_the_encryption_is_refused(workspace, backend):
    """An update appended to an encrypted PDF, whose trailer no longer names the encryption: pypdf
    takes the pages as plain and fails on their ciphertext; the document is still an encrypted one."""
    locked = encrypted_pdf(pdf_bytes([["confidential"]]))
    table_at = locked.rindex(b"\nxref\n") + 1
    table = locked[table_at:locked.index(b"trailer", table_at)]
    size = int(table.split(b"\n")[1].split()[1])
    update = table + b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, len(locked))
    path = workspace / "updated.pdf"
    path.write_bytes(locked + update)
    with pytest.raises(ValueError, match="PDF document is encrypted"):
        await read(make_agent(workspace, backend), path)


async def test_a_file_that_is_not_a_pdf_fails_clearly(workspace, backend):
    path = workspace / "fake.pdf"
    path.write_text("this is not a PDF", encoding="utf-8")
    with pytest.raises(ValueError, match="pdf document could not be parsed"):
        await read(make_agent(workspace, backend), path)


# -- DOCX -----------------------------------------------------------------------------------


async def test_docx_body_paragraphs_and_table_rows_in_document_order(workspace, backend):
    path = workspace / "report.docx"
    path.write_bytes(docx_bytes())
    result = await read(make_agent(workspace, backend), path)
    assert result["metadata"]["format"] == "docx"
    sections = result["sections"]
    # The cell holding a nested table keeps its own paragraphs (the one Word adds after the
    # nested table is empty); the nested table itself is not top-level content.
    last_cell = sections[3]["cells"].pop()
    assert last_cell.strip() == "12"
    assert "nested" not in json.dumps(result)
    assert sections == [
        {"location": {"paragraph": 1}, "text": "Quarterly report"},
        {"location": {"paragraph": 2}, "text": "Revenue grew in every region."},
        {"location": {"table": 1, "row": 1}, "cells": ["Region", "Q1", "Q2"]},
        {"location": {"table": 1, "row": 2}, "cells": ["North", "10"]},
        {"location": {"paragraph": 4}, "text": "Closing remarks."},
    ]
    assert result["truncated"] is False


async def test_docx_merged_cells_follow_the_grid_and_a_huge_span_is_bounded(workspace, backend):
    document = docx.Document()
    table = document.add_table(rows=2, cols=4)
    table.cell(0, 0).merge(table.cell(0, 1)).text = "wide"
    table.cell(0, 2).merge(table.cell(1, 2)).text = "tall"
    for (row, column), text in {(0, 3): "end", (1, 0): "a", (1, 1): "b", (1, 3): "z"}.items():
        table.cell(row, column).text = text
    buffer = io.BytesIO()
    document.save(buffer)
    huge_span = rewrite_entry(buffer.getvalue(), "word/document.xml",
                              lambda xml: re.sub(rb'<w:gridSpan w:val="2"/>', b'<w:gridSpan w:val="2000000000"/>', xml))
    (workspace / "merged.docx").write_bytes(buffer.getvalue())
    (workspace / "span.docx").write_bytes(huge_span)
    agent = make_agent(workspace, backend)

    merged = await read(agent, workspace / "merged.docx")
    assert [s["cells"] for s in merged["sections"]] == [["wide", "wide", "tall", "end"], ["a", "b", "", "z"]]

    spanned = await read(agent, workspace / "span.docx")
    assert spanned["sections"][0]["cells"] == ["wide"] * 100
    assert spanned["truncated"] is True


# -- XLSX -----------------------------------------------------------------------------------


async def test_xlsx_worksheet_rows_with_cached_values(workspace, backend):
    path = workspace / "book.xlsx"
    path.write_bytes(xlsx_bytes(cached_formula_value="42"))
    result = await read(make_agent(workspace, backend), path)
    assert result["metadata"]["format"] == "xlsx"
    assert result["sections"] == [
        {"location": {"sheet": "Sales", "row": 1}, "cells": ["41", "42"]},
        {"location": {"sheet": "Sales", "row": 2}, "cells": ["North", "2.5", "TRUE", "2024-03-01T09:30:00"]},
        {"location": {"sheet": "Sales", "row": 5}, "cells": ["after a gap"]},
        {"location": {"sheet": "Costs", "row": 1}, "cells": ["Rent", "1200"]},
    ]
    assert result["truncated"] is False


async def test_xlsx_formulas_are_not_evaluated_and_missing_caches_read_empty(workspace, backend):
    path = workspace / "uncached.xlsx"
    path.write_bytes(xlsx_bytes(cached_formula_value=None))
    result = await read(make_agent(workspace, backend), path)
    assert result["sections"][0] == {"location": {"sheet": "Sales", "row": 1}, "cells": ["41"]}
    assert "A1+1" not in json.dumps(result)


async def test_xlsx_row_numbers_beyond_excels_limit_are_refused_not_scanned_forever(workspace, backend):
    workbook = openpyxl.Workbook()
    workbook.active["A1"] = "top"
    workbook.active["A5"] = "far"
    buffer = io.BytesIO()
    workbook.save(buffer)
    hostile = rewrite_entry(buffer.getvalue(), "xl/worksheets/sheet1.xml",
                            lambda xml: xml.replace(b'r="5"', b'r="2000000000"').replace(b'r="A5"', b'r="A2000000000"'))
    path = workspace / "far.xlsx"
    path.write_bytes(hostile)
    with pytest.raises(ValueError, match="more than 1048576 rows"):
        await read(make_agent(workspace, backend), path)


@pytest.mark.parametrize("name, data", [
    ("secret.docx", lambda: encrypted_office(docx_bytes())),
    ("secret.xlsx", lambda: encrypted_office(xlsx_bytes(cached_formula_value="1"))),
])
async def test_password_protected_office_documents_are_refused(workspace, backend, name, data):
    path = workspace / name
    path.write_bytes(data())
    with pytest.raises(ValueError, match="encrypted"):
        await read(make_agent(workspace, backend), path)


# -- Office archive limits ------------------------------------------------------------------


async def test_a_zip_bomb_is_rejected_by_its_declared_size_before_parsing(workspace, backend):
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr("[Content_Types].xml", b"<Types/>")
        archive.writestr("word/document.xml", b"\0" * (40 * 1024 * 1024))
    path = workspace / "bomb.docx"
    path.write_bytes(bomb.getvalue())
    assert path.stat().st_size < 200_000, "the bomb is small on disk"
    with pytest.raises(ValueError, match="declares .* expanded bytes; the limit is 33554432"):
        await read(make_agent(workspace, backend), path)


async def test_max_archive_bytes_applies_to_a_genuine_document(workspace, backend):
    path = workspace / "report.xlsx"
    path.write_bytes(xlsx_bytes(cached_formula_value="42"))
    with pytest.raises(ValueError, match="max_archive_bytes"):
        await read(make_agent(workspace, backend, max_archive_bytes=1000), path)


async def test_an_archive_with_too_many_entries_is_rejected(workspace, backend):
    crowded = io.BytesIO()
    with zipfile.ZipFile(crowded, "w", zipfile.ZIP_STORED) as archive:
        for index in range(10_001):
            archive.writestr(f"x/{index}", b"")
    path = workspace / "crowded.xlsx"
    path.write_bytes(crowded.getvalue())
    with pytest.raises(ValueError, match="10001 entries; the limit is 10000"):
        await read(make_agent(workspace, backend), path)


async def test_an_office_file_that_is_not_a_zip_fails_clearly(workspace, backend):
    path = workspace / "plain.docx"
    path.write_text("not a zip", encoding="utf-8")
    with pytest.raises(ValueError, match="not a valid Office"):
        await read(make_agent(workspace, backend), path)


# -- paths and input limits -----------------------------------------------------------------


async def test_paths_must_be_absolute_inside_a_root_and_checked_before_approval(workspace, backend, tmp_path_factory):
    requests = []

    async def approve(request, run):
        requests.append(request)
        return True

    outside = tmp_path_factory.mktemp("outside")
    (outside / "x.txt").write_text("secret", encoding="utf-8")
    agent = Agent(AgentCard(name="reader"), policy=CapabilityPolicy({"filesystem.read": "require_approval"}),
                  approval_handler=approve)
    for tool in document_tools(roots=[workspace], backend=backend):
        agent.add_tool(tool)
    for path, message in [
        ("notes.txt", "must be absolute"),
        (str(outside / "x.txt"), "not inside a configured root"),
        (f"{workspace}/../{workspace.name}/x.txt", r"\.\."),
        (str(workspace / "program.exe"), "unsupported document type"),
    ]:
        with pytest.raises(ValueError, match=message):
            await agent.call_tool("read_document", path=path)
    assert requests == []


async def test_symlinks_directories_and_missing_files_are_rejected(workspace, backend):
    (workspace / "real.txt").write_text("data", encoding="utf-8")
    os.symlink(workspace / "real.txt", workspace / "link.txt")
    (workspace / "dir.txt").mkdir()
    (workspace / "sub").mkdir()
    os.symlink(workspace / "sub", workspace / "subl")
    (workspace / "sub" / "inner.csv").write_text("a\n", encoding="utf-8")
    agent = make_agent(workspace, backend)
    with pytest.raises(ValueError, match="symlink"):
        await read(agent, workspace / "link.txt")
    with pytest.raises(ValueError, match="symlink"):
        await read(agent, workspace / "subl" / "inner.csv")
    with pytest.raises(ValueError, match="directory"):
        await read(agent, workspace / "dir.txt")
    with pytest.raises(FileNotFoundError):
        await read(agent, workspace / "absent.md")


async def test_files_over_max_file_bytes_are_refused(workspace, backend):
    path = workspace / "large.txt"
    path.write_text("a" * 2048, encoding="utf-8")
    with pytest.raises(ValueError, match="2048 bytes; the limit is 2047"):
        await read(make_agent(workspace, backend, max_file_bytes=2047), path)


async def test_the_tools_require_filesystem_read(workspace, backend):
    (workspace / "a.txt").write_text("a", encoding="utf-8")
    tools = document_tools(roots=[workspace], backend=backend)
    assert {tool.name: tool.capabilities for tool in tools} == {
        "read_document": ("filesystem.read",), "search_document": ("filesystem.read",)}
    agent = Agent(AgentCard(name="denied"), policy=CapabilityPolicy({"filesystem.read": "deny"}))
    for tool in tools:
        agent.add_tool(tool)
    with pytest.raises(PolicyDeniedError):
        await agent.call_tool("read_document", path=str(workspace / "a.txt"))
    with pytest.raises(PolicyDeniedError):
        await agent.call_tool("search_document", path=str(workspace / "a.txt"), query="a")


# -- search ---------------------------------------------------------------------------------


async def test_search_is_literal_case_insensitive_and_located_by_line(workspace, backend):
    path = workspace / "notes.md"
    path.write_text("alpha\nprice is 3.50 USD\nPRICE IS 3x50\nnothing\n", encoding="utf-8")
    result = await make_agent(workspace, backend).call_tool(
        "search_document", path=str(path), query="Price is 3.5")
    assert result["matches"] == [{"location": {"line": 2}, "snippet": "price is 3.50 USD"}]
    assert result["query"] == "Price is 3.5"
    assert result["metadata"]["format"] == "md"
    assert result["truncated"] is False


async def test_search_locates_pdf_pages_and_lines(workspace, backend):
    path = workspace / "manual.pdf"
    path.write_bytes(pdf_bytes([["Setup"], ["Chapter two", "Reset the Device here"]]))
    result = await make_agent(workspace, backend).call_tool("search_document", path=str(path), query="device")
    assert len(result["matches"]) == 1
    match = result["matches"][0]
    assert match["location"]["page"] == 2
    assert match["location"]["line"] >= 1
    assert "Reset the Device here" in match["snippet"]


async def test_search_locates_rows_and_columns_in_tables(workspace, backend):
    (workspace / "book.xlsx").write_bytes(xlsx_bytes(cached_formula_value="42"))
    (workspace / "people.csv").write_text("name,city\nAda,north end\nBob,South\n", encoding="utf-8")
    agent = make_agent(workspace, backend)
    book = await agent.call_tool("search_document", path=str(workspace / "book.xlsx"), query="NORTH")
    assert book["matches"] == [{"location": {"sheet": "Sales", "row": 2, "column": 1}, "snippet": "North"}]
    people = await agent.call_tool("search_document", path=str(workspace / "people.csv"), query="th")
    assert people["matches"] == [{"location": {"row": 2, "column": 2}, "snippet": "north end"},
                                 {"location": {"row": 3, "column": 2}, "snippet": "South"}]


async def test_search_snippets_are_bounded_around_the_match(workspace, backend):
    path = workspace / "long.log"
    path.write_text("a" * 1000 + "NEEDLE" + "b" * 1000 + "\n", encoding="utf-8")
    result = await make_agent(workspace, backend).call_tool("search_document", path=str(path), query="needle")
    snippet = result["matches"][0]["snippet"]
    assert len(snippet) == 200
    assert "NEEDLE" in snippet


async def test_search_results_are_limited_and_report_truncation(workspace, backend):
    path = workspace / "many.txt"
    path.write_text("hit\n" * 30, encoding="utf-8")
    agent = make_agent(workspace, backend)
    limited = await agent.call_tool("search_document", path=str(path), query="HIT", max_results=5)
    assert [m["location"]["line"] for m in limited["matches"]] == [1, 2, 3, 4, 5]
    assert limited["truncated"] is True
    complete = await agent.call_tool("search_document", path=str(path), query="hit", max_results=100)
    assert len(complete["matches"]) == 30
    assert complete["truncated"] is False


async def test_search_stays_inside_the_bounded_extraction(workspace, backend):
    path = workspace / "tail.txt"
    path.write_text("x" * 500 + "\nneedle at the end\n", encoding="utf-8")
    result = await make_agent(workspace, backend, max_output_chars=100).call_tool(
        "search_document", path=str(path), query="needle")
    assert result["matches"] == []
    assert result["truncated"] is True, "an empty result from an incomplete extraction says so"


@pytest.mark.parametrize("arguments", [{"max_results": 0}, {"max_results": 101}, {"query": ""}])
async def test_search_arguments_are_validated(workspace, backend, arguments):
    (workspace / "a.txt").write_text("a", encoding="utf-8")
    call = {"path": str(workspace / "a.txt"), "query": "a", **arguments}
    with pytest.raises(ToolArgumentError):
        await make_agent(workspace, backend).call_tool("search_document", **call)


async def test_a_blank_or_multiline_query_is_rejected(workspace, backend):
    (workspace / "a.txt").write_text("a", encoding="utf-8")
    agent = make_agent(workspace, backend)
    for query in ("   ", "a\nb"):
        with pytest.raises(ValueError, match="query"):
            await agent.call_tool("search_document", path=str(workspace / "a.txt"), query=query)


# -- worker timeouts ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_pdf() -> bytes:
    return pdf_bytes([[f"Page {n} line {i} of the long report" for i in range(40)] for n in range(200)])


async def test_the_worker_timeout_stops_waiting(workspace, backend, long_pdf):
    path = workspace / "long.pdf"
    path.write_bytes(long_pdf)
    agent = make_agent(workspace, backend, timeout_seconds=0.001, max_sections=200, max_output_chars=10**7)
    with pytest.raises(TimeoutError):
        await read(agent, path)


async def test_the_run_budget_bounds_the_worker_timeout(workspace, backend, long_pdf):
    path = workspace / "long.pdf"
    path.write_bytes(long_pdf)
    agent = make_agent(workspace, backend, max_sections=200, max_output_chars=10**7)
    with pytest.raises(BudgetExceededError):
        await agent.call_tool("read_document", path=str(path), context=RunContext(max_seconds=0.01))
