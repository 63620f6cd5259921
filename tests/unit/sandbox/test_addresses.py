"""A sandbox server's address: the Unix socket it names, if any, whether that socket is gone,
and the target grpcio is given for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from protolink.sandbox.addresses import grpc_target, socket_gone, socket_path


def test_a_unix_address_names_its_socket_and_a_tcp_one_none():
    assert socket_path("unix:///run/protolink/sandbox.sock") == "/run/protolink/sandbox.sock"
    for tcp in ("127.0.0.1:50051", "tcp://127.0.0.1:50051", "[::1]:50051", "tcp://sandbox.example:443"):
        assert socket_path(tcp) is None


@pytest.mark.parametrize("tcp", ["127.0.0.1:50051", "tcp://[::1]:50051"])
def test_only_a_unix_socket_whose_file_is_missing_is_gone(tmp_path: Path, tcp: str):
    there = tmp_path / "sandbox.sock"
    there.touch()
    assert not socket_gone(f"unix://{there}")
    assert socket_gone(f"unix://{tmp_path / 'removed.sock'}")
    assert not socket_gone(tcp)  # a TCP address has no file to miss


def test_grpc_is_given_a_unix_address_as_it_is_and_a_tcp_one_without_its_scheme():
    assert grpc_target("unix:///run/protolink/sandbox.sock") == "unix:///run/protolink/sandbox.sock"
    assert grpc_target("tcp://127.0.0.1:50051") == "127.0.0.1:50051"
    assert grpc_target("[::1]:50051") == "[::1]:50051"
