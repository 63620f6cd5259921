"""OutputCap keeps one combined byte cap; OutputCollector decodes UTF-8 with replacement, keeps
the text and emits every piece of it once."""

import sys

import pytest

from protolink.execution.output import KeptText, OutputCap, OutputCollector


class Events:
    def __init__(self):
        self.texts = []

    async def emit(self, type, **data):
        assert type == "process.output"
        self.texts.append((data["channel"], data["text"]))


def test_the_cap_keeps_everything_under_it():
    cap = OutputCap(100)
    assert cap.take(b"a1 ") == b"a1 "
    assert cap.take(b"e1 ") == b"e1 "
    assert (cap.kept_bytes, cap.truncated) == (6, False)


def test_the_cap_is_shared_by_both_channels_and_later_bytes_are_dropped():
    cap = OutputCap(10)
    assert cap.take(b"123456") == b"123456"
    assert cap.take(b"abcdef") == b"abcd"
    assert cap.take(b"more") == b""
    assert cap.kept_bytes == 10 and cap.truncated


def test_exactly_filling_the_cap_is_not_truncation():
    cap = OutputCap(4)
    cap.take(b"1234")
    cap.take(b"")
    assert not cap.truncated


def test_negative_cap_is_rejected():
    with pytest.raises(ValueError):
        OutputCap(-1)


async def test_text_is_kept_per_channel_in_arrival_order_and_emitted_once():
    events = Events()
    collector = OutputCollector(events)
    await collector.feed("stdout", b"a1 ")
    await collector.feed("stderr", b"e1 ")
    await collector.feed("stdout", b"a2")
    await collector.finish()
    assert (collector.stdout, collector.stderr) == ("a1 a2", "e1 ")
    assert events.texts == [("stdout", "a1 "), ("stderr", "e1 "), ("stdout", "a2")]


@pytest.mark.parametrize("view", [bytes, memoryview], ids=["bytes", "view"])
async def test_a_character_split_across_chunks_decodes_whole(view):
    events = Events()
    collector = OutputCollector(events)
    encoded = view("é€😀".encode() + b"\xff!")
    for i in range(len(encoded)):
        await collector.feed("stdout", encoded[i:i + 1])
    await collector.finish()
    assert collector.stdout == "é€😀\ufffd!"
    assert [text for _, text in events.texts] == ["é", "€", "😀", "\ufffd", "!"]


async def test_channels_decode_independently():
    collector = OutputCollector(Events())
    euro = "€".encode()
    await collector.feed("stdout", euro[:1])
    await collector.feed("stderr", euro[:2])
    await collector.feed("stdout", euro[1:])
    await collector.feed("stderr", euro[2:])
    assert (collector.stdout, collector.stderr) == ("€", "€")


async def test_invalid_bytes_and_a_character_cut_by_the_cap_become_replacement_characters():
    cap, events = OutputCap(6), Events()
    collector = OutputCollector(events)
    await collector.feed("stdout", cap.take(b"\xff ok"))
    await collector.feed("stdout", cap.take("é€".encode()))  # 2 of its 5 bytes fit: "é" and nothing of "€"
    await collector.finish()
    assert collector.stdout == "\ufffd oké" and cap.truncated
    cut, events = OutputCap(2), Events()
    collector = OutputCollector(events)
    await collector.feed("stderr", cut.take("€".encode()))
    await collector.finish()
    assert collector.stderr == "\ufffd" and events.texts == [("stderr", "\ufffd")]


async def test_an_incomplete_character_at_the_end_is_kept_as_a_replacement_and_emitted():
    events = Events()
    collector = OutputCollector(events)
    await collector.feed("stdout", b"x\xe2\x82")
    await collector.finish()
    assert collector.stdout == "x\ufffd"
    assert events.texts == [("stdout", "x"), ("stdout", "\ufffd")]


async def test_close_keeps_the_tail_without_emitting_it():
    events = Events()
    collector = OutputCollector(events)
    await collector.feed("stdout", b"partial \xe2")
    assert collector.close() == [("stdout", "\ufffd")]
    assert collector.close() == []
    await collector.finish()
    assert collector.stdout == "partial \ufffd" and events.texts == [("stdout", "partial ")]


def test_text_kept_while_a_tracer_runs_is_copied_a_bounded_number_of_times():
    """Under a tracer or profiler (coverage, a debugger) Python 3.11 copies a string at each
    append: keeping 8 MiB of output in 4 KiB pieces one by one would copy about 1,000 times its
    size (a 1 GiB flood: hours). The kept text is copied at most 8 times its size, and stays exact."""
    copied = 0

    def tracer(frame, event, arg):
        nonlocal copied
        if event == "call" and frame.f_code is KeptText._append.__code__:
            copied += len(frame.f_locals["self"]._text)

    pieces = [chr(ord("a") + n % 26) * 4096 for n in range(2048)]
    kept = KeptText()
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        for n, piece in enumerate(pieces):
            kept.append(piece)
            if n == 1000:
                middle = kept.text
        text = kept.text
    finally:
        sys.settrace(previous)
    assert middle == "".join(pieces[:1001])
    assert text == "".join(pieces)
    assert copied <= 8 * len(text)
