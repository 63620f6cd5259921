"""The server's command line: roots, identities, and a token file that is consumed safely."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from protolink_sandboxd.config import parse_args

from protolink.wire.roots import Root

TOKEN = "t0ken-of-at-least-16-characters"


def test_roots_and_defaults():
    config = parse_args(["--listen", "unix:///run/s.sock", "--root", "/ws:rw", "--root", "/docs:ro"])
    assert config.roots == (Root("/ws", True), Root("/docs", False))
    assert (config.command_uid, config.command_gid) == (65534, 65534)
    assert config.boundary.startswith("sandbox:") and config.token is None
    assert config.command_memory_bytes == 0  # no address-space limit of its own (runc)
    limited = parse_args(["--listen", "unix:///run/s.sock", "--command-memory-bytes", str(384 << 20)])
    assert limited.command_memory_bytes == 384 << 20


def test_every_protection_is_checked_unless_the_placement_says_otherwise():
    config = parse_args(["--listen", "unix:///run/s.sock"])
    assert (config.serve_unprotected, config.held_elsewhere) == (False, frozenset())
    asked = parse_args(["--listen", "unix:///run/s.sock", "--serve-unprotected", "--held-elsewhere", "network",
                        "--held-elsewhere", "pids_limit"])
    assert (asked.serve_unprotected, asked.held_elsewhere) == (True, {"network", "pids_limit"})


def test_egress_port_and_socket():
    assert parse_args(["--listen", "unix:///run/protolink/sandbox.sock"]).egress_port == 0  # no egress by default
    config = parse_args(["--listen", "unix:///run/protolink/sandbox.sock", "--egress-port", "3128"])
    assert (config.egress_port, config.egress_socket) == (3128, "/run/protolink/egress.sock")


def test_a_ca_file_by_its_path_in_the_container():
    assert parse_args(["--listen", "unix:///run/s.sock"]).ca_file is None  # the image's authorities alone
    config = parse_args(["--listen", "unix:///run/s.sock", "--ca-file", "/run/protolink-ca/ca-certificates.pem"])
    assert config.ca_file == "/run/protolink-ca/ca-certificates.pem"


@pytest.mark.parametrize("argv", [
    ["--listen", "unix:///s", "--command-uid", "0"],
    ["--listen", "unix:///s", "--command-gid", "0"],
    ["--listen", "tcp://0.0.0.0:7000"],  # TCP without a token
    ["--listen", "tcp://0.0.0.0:7000", "--token-file", "/t"],  # TCP without TLS
    ["--listen", "tcp://0.0.0.0:7000", "--token-file", "/t", "--tls-cert-file", "/c"],  # a certificate without its key
    ["--listen", "http://x"],
    ["--listen", "unix:///s", "--root", "/ws"],  # access not declared
    ["--listen", "unix:///s", "--root", "relative:rw"],
    ["--listen", "unix:///s", "--root", "/ws/../etc:rw"],
    ["--listen", "unix:///s", "--command-memory-bytes", "-1"],
    ["--listen", "unix:///s", "--held-elsewhere", "seccomp"],  # the server must always see it
    ["--listen", "unix:///s", "--egress-port", "0"],
    ["--listen", "unix:///s", "--egress-port", "65536"],
    ["--listen", "tcp://0.0.0.0:7000", "--token-file", "/t", "--tls-cert-file", "/c", "--tls-key-file", "/k",
     "--egress-port", "3128"],  # egress needs the Unix socket
    ["--listen", "unix:///s", "--ca-file", "ca.pem"],
])
def test_refused_command_lines(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def tls_files(directory: Path) -> list[str]:
    """The TLS flags of a tcp:// listener, naming a certificate and key written in ``directory``."""
    (directory / "cert.pem").write_bytes(b"CERTIFICATE")
    (directory / "key.pem").write_bytes(b"KEY")
    return ["--tls-cert-file", str(directory / "cert.pem"), "--tls-key-file", str(directory / "key.pem")]


def test_the_token_and_tls_files_are_read_then_removed(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = parse_args(["--listen", "tcp://127.0.0.1:7000", "--token-file", str(token_file), *tls_files(tmp_path)])
    assert config.token == TOKEN and not token_file.exists()
    assert (config.tls_certificate, config.tls_key) == (b"CERTIFICATE", b"KEY")
    assert not (tmp_path / "cert.pem").exists() and not (tmp_path / "key.pem").exists()


def test_only_a_regular_token_file_is_consumed(tmp_path: Path):
    fifo, link, short = tmp_path / "fifo", tmp_path / "link", tmp_path / "short"
    os.mkfifo(fifo)
    (tmp_path / "target").write_text(TOKEN)
    link.symlink_to(tmp_path / "target")
    short.write_text("too short")
    tls = tls_files(tmp_path)
    for path in (fifo, link, short, tmp_path):
        with pytest.raises(SystemExit):
            parse_args(["--listen", "tcp://127.0.0.1:7000", "--token-file", str(path), *tls])
        assert os.path.lexists(path)
    assert (tmp_path / "target").read_text() == TOKEN
