"""``python3 -m protolink_sandboxd``'s start loads nothing it does not use: asyncio comes without
``ssl`` (and OpenSSL), the command line without ``shutil``, the seccomp filter without
``platform``; what they leave out still works. Each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import protolink_sandboxd.__main__ as server_main


def _fresh(code: str) -> Any:
    """What ``code`` (run in a new interpreter, ``-I`` like the image's) prints as JSON."""
    done = subprocess.run([sys.executable, "-I", "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_asyncio_comes_without_ssl_and_still_serves_a_unix_socket(tmp_path):
    found = _fresh(f"""
        import json, sys
        from protolink_sandboxd.__main__ import import_asyncio_without_ssl

        asyncio = import_asyncio_without_ssl()
        without = sorted({{"ssl", "_ssl"}} & set(sys.modules))

        async def echo_once():
            async def answer(reader, writer):
                writer.write(await reader.readline())
                await writer.drain()
                writer.close()

            server = await asyncio.start_unix_server(answer, {str(tmp_path / "echo.sock")!r})
            reader, writer = await asyncio.open_unix_connection({str(tmp_path / "echo.sock")!r})
            writer.write(b"ping\\n")
            line = await reader.readline()
            writer.close()
            server.close()
            await server.wait_closed()
            return line.decode()

        echoed = asyncio.run(echo_once())
        import ssl
        print(json.dumps({{"without": without, "echoed": echoed, "ssl_later": ssl.__name__}}))
    """)
    assert found == {"without": [], "echoed": "ping\n", "ssl_later": "ssl"}


def test_an_ssl_already_loaded_is_left_in_place():
    import ssl

    assert server_main.import_asyncio_without_ssl() is sys.modules["asyncio"]
    assert sys.modules["ssl"] is ssl


def test_the_command_line_and_the_seccomp_filter_load_neither_shutil_nor_platform():
    found = _fresh("""
        import json, sys
        import protolink_sandboxd.seccomp_filter
        from protolink_sandboxd.config import parse_args

        parse_args(["--listen", "unix:///run/protolink/sandbox.sock", "--root", "/ws:rw"])
        print(json.dumps(sorted({"shutil", "platform", "bz2", "lzma"} & set(sys.modules))))
    """)
    assert found == []


def test_help_is_formatted_whatever_the_terminal():
    done = subprocess.run([sys.executable, "-I", "-m", "protolink_sandboxd", "--help"], capture_output=True,
                          text=True, timeout=60, env={"COLUMNS": "40"})
    assert done.returncode == 0, done.stderr
    assert "--listen LISTEN" in done.stdout and max(map(len, done.stdout.splitlines())) <= 100
