"""A command as a person types it (``protolink-sandbox exec``, ``SyncSandbox.run``): the
environment it gets, and where a bare name is looked up. Imports nothing: ``exec`` is timed."""

from __future__ import annotations

from collections.abc import Sequence

#: What a typed command's environment holds.
COMMAND_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def typed_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` to run: an absolute ``argv[0]`` as it is; a bare name is looked up in the
    sandbox's ``PATH`` there (through ``/usr/bin/env``), never on the host."""
    return list(argv) if argv[0].startswith("/") else ["/usr/bin/env", "--", *argv]
