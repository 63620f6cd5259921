"""Progress shows each command and its output, and never a value passed in with --env."""

from __future__ import annotations

import io

from protolink.sandbox.ci.progress import MASK, Masker, PlainLines, StatusLine


def test_every_passed_value_is_masked_the_longest_first():
    masker = Masker(["s3cret-token", "s3cret", "ab"])
    assert masker("x s3cret-token y s3cret z ab") == f"x {MASK} y {MASK} z ab"


def test_plain_lines_mask_a_value_split_across_two_pieces_of_output():
    out, err = io.StringIO(), io.StringIO()
    lines = PlainLines(Masker(["hunter22"]), out=out, err=err)
    lines.command("test", "env")
    lines.output("TOKEN=hun")
    lines.output("ter22\nnext ")
    lines.output("line")
    lines.ended("test: exit 0")
    assert out.getvalue() == f"TOKEN={MASK}\nnext line\n"
    assert "hunter22" not in err.getvalue() and "ci: test: $ env" in err.getvalue()


def test_plain_lines_show_a_line_without_end_once_it_is_too_long():
    out = io.StringIO()
    lines = PlainLines(Masker([]), out=out, err=io.StringIO())
    lines.output("x" * (70 * 1024))
    assert len(out.getvalue()) > 64 * 1024


def test_the_status_line_shows_the_last_output_line_without_control_characters():
    err = io.StringIO()
    status = StatusLine(Masker(["hunter22"]), err=err)
    status.phase("test")
    status.command("test", "pytest -q")
    status.output("first\nsecond hunter22 \x1b[31mred\n")
    status.tick()
    last = err.getvalue().rsplit("\r\x1b[2K", 1)[-1]
    assert "[test" in last and "pytest -q" in last
    assert f"second {MASK}" in last and "\x1b[31m" not in last
