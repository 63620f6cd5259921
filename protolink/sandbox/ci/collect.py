"""What comes out of a finished job: JUnit results and artifacts, bounded and checked.

It runs once the job's container is gone, so nothing changes the workspace meanwhile. Patterns
are globs relative to the repository (``*`` and ``?`` within a name, ``**`` across directories).
The walk never enters a symbolic link; a match that is a link, not a regular file, too large, or
beyond the count and total caps is reported with its reason and never read. JUnit files are
parsed with junitparser over a parser that loads no DTD, resolves no entity and reaches no
network; a file that is not such XML is reported, not trusted. Every kept file is copied into the
output directory (JUnit files under ``junit/``), mode 0644, with its size and SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .job import OutputLimits

_READ_CHUNK = 1 << 20


@dataclass
class Collected:
    """Files kept (``files``: path, bytes, sha256 and, for JUnit, its counts) and refused
    (``rejected``: path and reason)."""

    files: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"files": self.files, "rejected": self.rejected}


def glob_regex(pattern: str) -> re.Pattern[str]:
    """The regular expression of a relative glob: ``**`` any number of directories, ``*`` and
    ``?`` within one name, ``[...]`` a class."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1:end].replace("\\", "\\\\")
            out.append(f"[^{body[1:]}]" if body.startswith("!") else f"[{body}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def walk(top: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry beneath ``top`` but directories, as (relative path, lstat), never through a link."""
    pending = [""]
    while pending:
        relative = pending.pop()
        try:
            entries = sorted(os.scandir(top / relative), key=lambda entry: entry.name)
        except OSError:
            continue  # a directory the job made unreadable holds nothing to collect
        for entry in entries:
            path = f"{relative}/{entry.name}" if relative else entry.name
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                pending.append(path)
            else:
                yield path, info


def matches(top: Path, patterns: Sequence[str]) -> list[tuple[str, os.stat_result]]:
    """The entries beneath ``top`` that one of ``patterns`` matches, in path order."""
    if not patterns:
        return []
    regexes = [glob_regex(pattern) for pattern in patterns]
    found = [(path, info) for path, info in walk(top) if any(regex.fullmatch(path) for regex in regexes)]
    return sorted(found, key=lambda item: item[0])


def _refusal(info: os.stat_result, max_bytes: int) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        return "a symbolic link (not followed)"
    if not stat.S_ISREG(info.st_mode):
        return f"not a regular file ({stat.filemode(info.st_mode)})"
    if info.st_size > max_bytes:
        return f"{info.st_size} bytes, more than the {max_bytes} allowed"
    return None


def _copy(source: Path, target: Path, max_bytes: int) -> tuple[bytes | None, int, str]:
    """Copy ``source`` (never through a link) to ``target``; its bytes when ``max_bytes`` allow
    keeping them in memory (JUnit), its size and SHA-256."""
    digest = hashlib.sha256()
    kept = bytearray()
    size = 0
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{source} is not a regular file")
        with open(target, "wb") as out:
            os.fchmod(out.fileno(), 0o644)
            while chunk := os.read(fd, _READ_CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise OSError(f"{source} grew past {max_bytes} bytes")
                digest.update(chunk)
                out.write(chunk)
                kept += chunk
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return bytes(kept), size, digest.hexdigest()


def collect_artifacts(repo: Path, patterns: Sequence[str], out: Path, limits: OutputLimits) -> Collected:
    """Copy what ``patterns`` match beneath ``repo`` into ``out``, within ``limits``."""
    result = Collected()
    total = 0
    for path, info in matches(repo, patterns):
        reason = _refusal(info, limits.artifact_file_bytes)
        if reason is None and len(result.files) >= limits.artifact_files:
            reason = f"beyond the first {limits.artifact_files} artifacts"
        if reason is None and total + info.st_size > limits.artifact_bytes:
            reason = f"beyond {limits.artifact_bytes} bytes of artifacts in all"
        if reason is not None:
            result.rejected.append({"path": path, "reason": reason})
            continue
        try:
            _, size, sha256 = _copy(repo / path, out / path, limits.artifact_file_bytes)
        except OSError as error:
            result.rejected.append({"path": path, "reason": str(error)})
            continue
        total += size
        result.files.append({"path": path, "bytes": size, "sha256": sha256})
    return result


def collect_junit(repo: Path, patterns: Sequence[str], out: Path, limits: OutputLimits) -> Collected:
    """Copy and parse the JUnit XML files ``patterns`` match beneath ``repo``; each kept file
    carries its ``tests``, ``passed``, ``failures``, ``errors`` and ``skipped``."""
    result = Collected()
    for path, info in matches(repo, patterns):
        reason = _refusal(info, limits.junit_file_bytes)
        if reason is None and len(result.files) >= limits.junit_files:
            reason = f"beyond the first {limits.junit_files} JUnit files"
        if reason is not None:
            result.rejected.append({"path": path, "reason": reason})
            continue
        try:
            data, size, sha256 = _copy(repo / path, out / "junit" / path, limits.junit_file_bytes)
            counts = junit_counts(data or b"")
        except (OSError, ValueError) as error:
            (out / "junit" / path).unlink(missing_ok=True)
            result.rejected.append({"path": path, "reason": str(error)})
            continue
        result.files.append({"path": path, "bytes": size, "sha256": sha256, **counts})
    return result


def junit_counts(data: bytes) -> dict[str, int]:
    """Test cases by outcome in one JUnit XML document; ValueError when it is not one."""
    from junitparser import JUnitXmlError, TestCase
    from lxml import etree

    parser = etree.XMLParser(resolve_entities=False, load_dtd=False, no_network=True, huge_tree=False,
                             remove_comments=True)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as error:
        raise ValueError(f"not XML: {error}") from None
    if root is None or root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"not JUnit XML: the root element is <{getattr(root, 'tag', None)}>")
    counts = {"tests": 0, "passed": 0, "failures": 0, "errors": 0, "skipped": 0}
    try:
        for element in root.iter("testcase"):
            case = TestCase.fromelem(element)
            kinds = {type(result).__name__ for result in case.result}
            outcome = ("errors" if "Error" in kinds else "failures" if "Failure" in kinds
                       else "skipped" if "Skipped" in kinds else "passed")
            counts[outcome] += 1
            counts["tests"] += 1
    except JUnitXmlError as error:
        raise ValueError(f"not JUnit XML: {error}") from None
    return counts


def junit_totals(collected: Collected) -> dict[str, int]:
    """The counts of every parsed JUnit file, summed."""
    keys = ("tests", "passed", "failures", "errors", "skipped")
    return {key: sum(item[key] for item in collected.files) for key in keys}
