"""The host backend's document timeout is a deadline on the extraction, whatever the event loop was doing."""

from __future__ import annotations

import asyncio
import time

import pytest

from protolink.execution.extract import DocumentLimits
from protolink.execution.local import LocalExecutionBackend
from tests.behaviour.test_documents import pdf_bytes


async def test_an_extraction_that_ends_after_its_deadline_is_a_timeout_even_if_the_loop_sees_it_late(tmp_path):
    path = tmp_path / "long.pdf"
    path.write_bytes(pdf_bytes([[f"page {n} line {i}" for i in range(40)] for n in range(200)]))
    limits = DocumentLimits(max_sections=200, max_output_chars=10**7, timeout_seconds=0.01)
    reading = asyncio.ensure_future(LocalExecutionBackend().read_document(str(path), roots=[str(tmp_path)], limits=limits))
    await asyncio.sleep(0.002)  # the extraction starts on its thread
    time.sleep(0.5)  # the loop is busy: the finished extraction and the expired timer reach it together

    with pytest.raises(TimeoutError, match="did not finish within 0.01 seconds"):
        await reading


async def test_an_extraction_within_its_deadline_is_returned(tmp_path):
    path = tmp_path / "short.pdf"
    path.write_bytes(pdf_bytes([["one page"]]))

    extraction = await LocalExecutionBackend().read_document(str(path), roots=[str(tmp_path)], limits=DocumentLimits())

    assert [section.text.strip() for section in extraction.sections] == ["one page"]
