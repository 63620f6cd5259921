"""Hand-built PDF files for tests that need shapes no PDF writer makes (loops, bombs, slow pages)."""

from __future__ import annotations


def pdf(objects: list[bytes]) -> bytes:
    """A PDF whose objects are numbered from 1 in order (object 1 is the catalog), with a valid xref."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)
