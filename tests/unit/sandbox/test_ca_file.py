"""A sandbox's CA file is refused, with a CaFileError naming it, before any container is made,
unless it is a readable regular file of at most 4 MiB holding a PEM certificate; the copy a
sandbox gets is readable by its commands' user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from protolink.errors import CaFileError
from protolink.sandbox.ca_file import MAX_CA_BYTES, copy_ca_file
from protolink.sandbox.config import SandboxConfig
from protolink.sandbox.docker import DockerSandbox

#: Not a valid certificate: the check looks for a PEM certificate, it does not parse one.
PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_bytes(PEM)
    return path


def test_a_bundle_is_taken_by_its_absolute_path(bundle, monkeypatch):
    monkeypatch.chdir(bundle.parent)
    assert SandboxConfig.from_options(ca_file="ca.pem").ca_file == str(bundle)
    assert SandboxConfig().ca_file is None and SandboxConfig.from_options().ca_file is None
    assert DockerSandbox(ca_file=bundle).config.ca_file == str(bundle)


def oversized(tmp_path: Path) -> Path:
    path = tmp_path / "large.pem"
    path.write_bytes(PEM * (MAX_CA_BYTES // len(PEM) + 1))
    return path


def no_certificate(tmp_path: Path) -> Path:
    path = tmp_path / "key.pem"
    path.write_bytes(b"-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n")
    return path


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.pem"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(("make", "why"), [
    (lambda tmp: tmp / "missing.pem", "No such file or directory"),
    (lambda tmp: tmp, "Is a directory"),
    (fifo, "is not a regular file"),
    (no_certificate, "holds no PEM certificate"),
    (oversized, "is larger than 4 MiB"),
], ids=["missing", "directory", "fifo", "no-certificate", "too-large"])
def test_a_file_that_is_no_bundle_is_refused_before_anything_starts(tmp_path, make, why):
    path = make(tmp_path)
    with pytest.raises(CaFileError, match=why) as refused:
        DockerSandbox(ca_file=path)
    assert refused.value.path == str(path) and str(refused.value).startswith(f"ca_file {path}")
    assert isinstance(refused.value, ValueError)  # a configuration's refusal, as every other field's
    with pytest.raises(CaFileError, match=why):
        SandboxConfig(ca_file=str(path))


def test_a_relative_path_is_refused_by_the_configuration(bundle):
    with pytest.raises(ValueError, match="^sandbox config: ca_file must be an absolute path"):
        SandboxConfig(ca_file="ca.pem")


def test_the_copy_holds_the_bundle_and_every_user_may_read_it(bundle, tmp_path):
    old = os.umask(0o077)
    try:
        copy_ca_file(bundle, tmp_path / "copy.pem")
    finally:
        os.umask(old)
    assert (tmp_path / "copy.pem").read_bytes() == PEM
    assert stat.S_IMODE((tmp_path / "copy.pem").stat().st_mode) == 0o644
