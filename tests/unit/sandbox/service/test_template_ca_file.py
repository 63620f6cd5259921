"""A template's CA file (``ca_file``) is the operator's: checked when the configuration is loaded
(a service with a bad one does not start, and says which template), refused on Swarm, kept by
every create of the template, and given to its sandboxes as SandboxConfig.ca_file."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from protolink.errors import CaFileError
from protolink.sandbox.service.config import Overrides, ServiceConfig
from protolink.sandbox.service.daemon import main
from protolink.sandbox.service.sandboxes import new_placed, sandbox_config
from tests.unit.sandbox.test_ca_file import bundle  # noqa: F401 (a fixture)

SWARM = '[swarm]\nmanager = "unix:///m.sock"\ngateway_token_file = "/t"\nnodes = {}\n'


def _load(tmp_path: Path, text: str) -> ServiceConfig:
    path = tmp_path / "service.toml"
    path.write_text(text)
    return ServiceConfig.load(path, image="base:1")


def test_a_templates_ca_file_reaches_its_sandboxes_whatever_a_create_changes(tmp_path, bundle):
    config = _load(tmp_path, f'[templates.default]\n[templates.intercepted]\nca_file = "{bundle}"\npool = 1\n')
    intercepted = config.template("intercepted")
    assert (intercepted.ca_file, config.template("default").ca_file) == (str(bundle), None)
    for template in (intercepted, Overrides(image="other:1", memory_bytes=128 << 20, allow=()).applied(intercepted)):
        placed = new_placed("0123456789abcdef", "tenant", template, Overrides())
        assert sandbox_config("svc", placed, (), "svc.tenant.0123456789abcdef").ca_file == str(bundle)


@pytest.mark.parametrize(("ca_file", "refusal"), [
    ("{tmp}/missing.pem", "template 'intercepted': ca_file {tmp}/missing.pem: No such file or directory"),
    ("{tmp}/empty.pem", "template 'intercepted': ca_file {tmp}/empty.pem holds no PEM certificate"),
])
def test_a_ca_file_that_cannot_be_used_is_refused_naming_the_template(tmp_path, ca_file, refusal):
    (tmp_path / "empty.pem").write_text("not a certificate\n")
    with pytest.raises(CaFileError) as refused:
        _load(tmp_path, f'[templates.default]\n[templates.intercepted]\nca_file = "{ca_file.format(tmp=tmp_path)}"\n')
    assert str(refused.value).startswith(refusal.format(tmp=tmp_path))


@pytest.mark.parametrize("ca_file", ['"ca.pem"', "1"])
def test_a_ca_file_that_is_not_an_absolute_path_is_refused(tmp_path, bundle, monkeypatch, ca_file):
    monkeypatch.chdir(tmp_path)  # ca.pem is there: still refused, the service's directory is not the file's
    with pytest.raises(ValueError, match="template 'default': ca_file must be an absolute path"):
        _load(tmp_path, f"[templates.default]\nca_file = {ca_file}\n")


def test_a_ca_file_on_swarm_is_refused(tmp_path, bundle):
    with pytest.raises(ValueError, match="template 'default': ca_file is not placed on Swarm"):
        _load(tmp_path, f'[templates.default]\nca_file = "{bundle}"\n' + SWARM)


def test_a_service_with_a_bad_ca_file_does_not_start(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(tmp_path))
    config = tmp_path / "service.toml"
    config.write_text(f'[templates.default]\nca_file = "{tmp_path}/missing.pem"\n')
    with caplog.at_level(logging.ERROR):
        assert main(["--name", "svc", "--config", str(config)]) == 2
    assert f"template 'default': ca_file {tmp_path}/missing.pem: No such file or directory" in caplog.text
    assert sorted(path.name for path in tmp_path.iterdir()) == ["service.toml"]  # nothing of a service made
