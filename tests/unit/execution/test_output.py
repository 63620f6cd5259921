"""OutputCollector: one combined byte cap, incremental UTF-8 decoding with replacement."""

import pytest

from protolink.execution.output import OutputCollector


def test_keeps_everything_under_the_cap_in_arrival_order():
    collector = OutputCollector(100)
    assert collector.feed("stdout", b"a1 ") == "a1 "
    assert collector.feed("stderr", b"e1 ") == "e1 "
    assert collector.feed("stdout", b"a2") == "a2"
    assert collector.close() == []
    assert (collector.stdout, collector.stderr, collector.truncated) == ("a1 a2", "e1 ", False)


def test_cap_is_shared_by_both_channels_and_later_bytes_are_discarded():
    collector = OutputCollector(10)
    assert collector.feed("stdout", b"123456") == "123456"
    assert collector.feed("stderr", b"abcdef") == "abcd"
    assert collector.feed("stdout", b"more") == ""
    assert (collector.stdout, collector.stderr, collector.kept_bytes) == ("123456", "abcd", 10)
    assert collector.truncated


def test_exactly_filling_the_cap_is_not_truncation():
    collector = OutputCollector(4)
    collector.feed("stdout", b"1234")
    assert not collector.truncated
    collector.feed("stdout", b"")
    assert not collector.truncated


def test_a_character_split_across_chunks_decodes_whole():
    collector = OutputCollector(100)
    encoded = "é€😀".encode()
    texts = [collector.feed("stdout", encoded[i:i + 1]) for i in range(len(encoded))]
    assert "".join(texts) == "é€😀"
    assert all(len(text) <= 1 for text in texts)


def test_channels_decode_independently():
    collector = OutputCollector(100)
    euro = "€".encode()
    collector.feed("stdout", euro[:1])
    collector.feed("stderr", euro[:2])
    collector.feed("stdout", euro[1:])
    collector.feed("stderr", euro[2:])
    assert (collector.stdout, collector.stderr) == ("€", "€")


def test_invalid_bytes_and_a_character_cut_by_the_cap_become_replacement_characters():
    collector = OutputCollector(6)
    collector.feed("stdout", b"\xff ok")
    collector.feed("stdout", "é€".encode())  # 2 of its 5 bytes fit: "é" and nothing of "€"
    assert collector.close() == []
    assert collector.stdout == "\ufffd oké"
    cut = OutputCollector(2)
    cut.feed("stderr", "€".encode())
    assert cut.close() == [("stderr", "\ufffd")]
    assert cut.stderr == "\ufffd" and cut.truncated


def test_incomplete_character_at_the_end_is_flushed_as_replacement():
    collector = OutputCollector(100)
    assert collector.feed("stdout", b"x\xe2\x82") == "x"
    assert collector.close() == [("stdout", "\ufffd")]
    assert collector.stdout == "x\ufffd"


def test_negative_cap_is_rejected():
    with pytest.raises(ValueError):
        OutputCollector(-1)
