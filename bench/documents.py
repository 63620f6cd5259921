"""read_document on a 200-page PDF against calling pypdf directly.

Both sides extract the text of every page of the same generated PDF: ``read_document`` through
``Agent.call_tool`` (validation, preparation, path checks, the descriptor-based read, a worker
thread, section limits, events) with limits large enough to keep all pages, and a bare
``PdfReader`` loop over ``page.extract_text()``. The figure is the ratio of medians,
target <= 1.1::

    python bench/documents.py
"""

from __future__ import annotations

import asyncio
import io
import statistics
import tempfile
import time
from pathlib import Path

from pypdf import PdfReader
from reportlab.lib.pagesizes import A4
from reportlab.pdfgen import canvas

from protolink import Agent, AgentCard
from protolink.tools import document_tools

PAGES = 200
LINES = 40
ROUNDS = 7


def make_pdf(path: Path) -> None:
    pdf = canvas.Canvas(str(path), pagesize=A4)
    for page in range(PAGES):
        for line in range(LINES):
            pdf.drawString(40, 800 - line * 19, f"page {page + 1} line {line + 1}: quarterly figures and notes")
        pdf.showPage()
    pdf.save()


def pypdf_direct(source: Path | io.BytesIO) -> int:
    return sum(len(page.extract_text()) for page in PdfReader(source).pages)


async def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory).resolve()
        path = root / "report.pdf"
        make_pdf(path)
        agent = Agent(AgentCard(name="bench"))
        for tool in document_tools(roots=[root], max_sections=PAGES, max_output_chars=10**8,
                                   timeout_seconds=600):
            agent.add_tool(tool)

        tool_times, direct_times, memory_times = [], [], []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            result = await agent.call_tool("read_document", path=str(path))
            tool_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            direct_chars = pypdf_direct(path)
            direct_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            pypdf_direct(io.BytesIO(path.read_bytes()))
            memory_times.append(time.perf_counter() - started)
        tool_chars = sum(len(section["text"]) for section in result["sections"])
        assert len(result["sections"]) == PAGES and not result["truncated"], "every page is extracted"

        tool = statistics.median(tool_times)
        direct, memory = statistics.median(direct_times), statistics.median(memory_times)
        print(f"{PAGES}-page PDF, {path.stat().st_size} bytes, median of {ROUNDS} rounds")
        print(f"{'':14}{'read_document':>15}{'pypdf(path)':>14}{'pypdf(bytes)':>14}{'ratio/path':>12}{'ratio/bytes':>13}")
        print(f"{'wall time':14}{tool * 1e3:>12.0f} ms{direct * 1e3:>11.0f} ms{memory * 1e3:>11.0f} ms"
              f"{tool / direct:>12.3f}{tool / memory:>13.3f}   (target <= 1.1)")
        print(f"{'characters':14}{tool_chars:>15}{direct_chars:>14}")


if __name__ == "__main__":
    asyncio.run(main())
