"""Office Open XML containers (DOCX, XLSX) are zip archives: check them before any parser runs.

The entry count and the sum of the sizes the central directory declares are checked against the
limits first, so a zip bomb is rejected without inflating anything. Python's ``zipfile``, which
both Office parsers use, never returns more bytes for an entry than its declared size, so the
declared total also bounds what the parsers can inflate.
"""

from __future__ import annotations

import codecs
import io
import zipfile

from protolink.errors import DocumentError

# zipfile decodes legacy entry names as cp437; load the codec now, while imports still work
# (a sandbox worker drops its privileges after importing and may not read the library again).
codecs.lookup("cp437")

MAX_ARCHIVE_ENTRIES = 10_000

# Encrypted OOXML is not a zip: it is an OLE compound file wrapping the encrypted package.
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


def check_office_archive(data: bytes, format_name: str, max_archive_bytes: int) -> None:
    """Raise ValueError for an encrypted, malformed or oversized Office archive."""
    if data.startswith(_OLE_MAGIC):
        raise DocumentError(
            f"{format_name} document is an OLE compound file: a password-protected (encrypted) "
            "Office document or a legacy binary format; encrypted documents are unsupported"
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as error:
        raise DocumentError(f"{format_name} document is not a valid Office (zip) archive: {error}") from None
    if len(entries) > MAX_ARCHIVE_ENTRIES:
        raise DocumentError(
            f"{format_name} archive has {len(entries)} entries; the limit is {MAX_ARCHIVE_ENTRIES}"
        )
    if any(entry.flag_bits & 0x1 for entry in entries):
        raise DocumentError(f"{format_name} archive has encrypted entries; encrypted documents are unsupported")
    declared = sum(entry.file_size for entry in entries)
    if declared > max_archive_bytes:
        raise DocumentError(
            f"{format_name} archive declares {declared} expanded bytes; the limit is "
            f"{max_archive_bytes} (max_archive_bytes)"
        )
