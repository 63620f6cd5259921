"""JUnit files and artifacts come out bounded, checked and never through a link."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest

from protolink.sandbox.ci.collect import collect_artifacts, collect_junit, glob_regex, junit_counts, junit_totals
from protolink.sandbox.ci.job import OutputLimits

PYTEST_JUNIT = b"""<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4">
<testcase classname="t" name="a"/>
<testcase classname="t" name="b"><failure message="boom">trace</failure></testcase>
<testcase classname="t" name="c"><skipped message="later"/></testcase>
<testcase classname="t" name="d"><error message="fixture"/></testcase>
</testsuite></testsuites>"""


@pytest.mark.parametrize("pattern, matching, not_matching", [
    ("junit.xml", ["junit.xml"], ["a/junit.xml", "junit.xmlx"]),
    ("**/junit*.xml", ["junit.xml", "a/b/junit-1.xml"], ["a/b/other.xml"]),
    ("reports/*.xml", ["reports/x.xml"], ["reports/a/x.xml", "x.xml"]),
    ("dist/**", ["dist/a.whl", "dist/a/b.tar.gz"], ["src/dist/a"]),
    ("out?.[ch]", ["out1.c", "outx.h"], ["out12.c", "out1.o"]),
    ("log[!0-9].txt", ["logx.txt"], ["log1.txt"]),
])
def test_globs_match_relative_paths(pattern, matching, not_matching):
    regex = glob_regex(pattern)
    assert [path for path in matching if regex.fullmatch(path)] == matching
    assert [path for path in not_matching if regex.fullmatch(path)] == []


def test_junit_counts_each_case_by_its_outcome_not_by_the_totals_it_claims():
    claimed = PYTEST_JUNIT.replace(b'tests="4"', b'tests="400"')
    assert junit_counts(claimed) == {"tests": 4, "passed": 1, "failures": 1, "errors": 1, "skipped": 1}


def test_nested_suites_and_a_bare_testsuite_root_are_counted():
    nested = b"<testsuite><testsuite><testcase name='a'/></testsuite><testcase name='b'><failure/></testcase></testsuite>"
    assert junit_counts(nested) == {"tests": 2, "passed": 1, "failures": 1, "errors": 0, "skipped": 0}


@pytest.mark.parametrize("document, reason", [
    (b"PASSED 3 tests", "not XML"),
    (b"<html><body/></html>", "not JUnit XML"),
    (b'<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
     b'<testsuite><testcase name="&x;"/></testsuite>', "external entity"),
])
def test_what_is_not_junit_xml_is_refused(document, reason):
    with pytest.raises(ValueError, match=reason):
        junit_counts(document)


def test_an_entity_expansion_bomb_is_not_expanded():
    lol = b'<!ENTITY a "' + b"x" * 100 + b'">' + b"".join(
        b'<!ENTITY %c "%s">' % (ord("b") + i, (b"&%c;" % (ord("a") + i)) * 10) for i in range(8))
    bomb = b'<?xml version="1.0"?><!DOCTYPE t [' + lol + b']><testsuite><testcase name="&i;"/></testsuite>'
    try:
        counts = junit_counts(bomb)
    except ValueError:
        return  # refused: as good as not expanded
    assert counts["tests"] == 1


def _tree(tmp_path):
    repo = tmp_path / "repo"
    (repo / "reports").mkdir(parents=True)
    (repo / "reports" / "junit.xml").write_bytes(PYTEST_JUNIT)
    (repo / "reports" / "broken.xml").write_text("not xml")
    os.symlink("/etc/shadow", repo / "reports" / "shadow.xml")
    os.symlink("/etc", repo / "etc-link")
    os.mkfifo(repo / "reports" / "fifo.xml")
    (repo / "dist").mkdir()
    (repo / "dist" / "tool").write_bytes(b"\x7fELF binary")
    os.chmod(repo / "dist" / "tool", 0o4755)
    return repo


def test_junit_files_are_copied_and_counted_and_the_rest_refused_with_reasons(tmp_path):
    repo = _tree(tmp_path)
    out = tmp_path / "out"
    collected = collect_junit(repo, ["reports/*.xml", "etc-link/**"], out, OutputLimits())
    assert [item["path"] for item in collected.files] == ["reports/junit.xml"]
    assert (out / "junit" / "reports" / "junit.xml").read_bytes() == PYTEST_JUNIT
    assert junit_totals(collected) == {"tests": 4, "passed": 1, "failures": 1, "errors": 1, "skipped": 1}
    reasons = {item["path"]: item["reason"] for item in collected.rejected}
    assert set(reasons) == {"reports/broken.xml", "reports/shadow.xml", "reports/fifo.xml"}
    assert "symbolic link" in reasons["reports/shadow.xml"] and "not XML" in reasons["reports/broken.xml"]
    assert not (out / "junit" / "reports" / "broken.xml").exists()


def test_artifacts_lose_set_id_bits_and_carry_their_hash(tmp_path):
    repo = _tree(tmp_path)
    out = tmp_path / "out"
    collected = collect_artifacts(repo, ["dist/**"], out, OutputLimits())
    assert collected.files == [{"path": "dist/tool", "bytes": 11,
                                "sha256": hashlib.sha256(b"\x7fELF binary").hexdigest()}]
    assert stat.S_IMODE((out / "dist" / "tool").stat().st_mode) == 0o644


def test_artifacts_beyond_the_caps_are_refused_not_cut(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    for index, size in enumerate((10, 20, 30, 40)):
        (repo / f"a{index}.bin").write_bytes(b"x" * size)
    limits = OutputLimits(artifact_file_bytes=35, artifact_bytes=45, artifact_files=3)
    collected = collect_artifacts(repo, ["*.bin"], tmp_path / "out", limits)
    assert [item["path"] for item in collected.files] == ["a0.bin", "a1.bin"]
    reasons = {item["path"]: item["reason"] for item in collected.rejected}
    assert "in all" in reasons["a2.bin"] and "more than the 35" in reasons["a3.bin"]
    assert sorted(os.listdir(tmp_path / "out")) == ["a0.bin", "a1.bin"]
