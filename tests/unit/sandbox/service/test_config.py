"""Templates, overrides and the roots a service allows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from protolink.errors import SandboxPermissionError
from protolink.sandbox.cli import main
from protolink.sandbox.service.config import NodeGateway, Overrides, ServiceConfig
from protolink.sandbox.service.labels import container_name, owner_of, swarm_name
from protolink.wire.roots import Root


def test_a_config_file_gives_templates_pools_and_allowed_roots(tmp_path):
    (tmp_path / "data").mkdir()
    path = tmp_path / "service.toml"
    path.write_text(f"""
allowed_roots = ["{tmp_path / 'data'}"]
[templates.default]
memory_mib = 256
pool = 2
[templates.web]
image = "other:1"
allow = ["pypi.org:443"]
ttl_seconds = 0
""")
    config = ServiceConfig.load(path, image="base:1", pool=3)
    default, web = config.template(""), config.template("web")
    assert (default.image, default.memory_bytes, default.pool) == ("base:1", 256 << 20, 3)
    assert (web.image, web.allow, web.ttl_seconds, web.pool) == ("other:1", ("pypi.org:443",), None, 0)
    with pytest.raises(ValueError, match="no template 'gpu'"):
        config.template("gpu")
    assert config.checked_roots((Root(str(tmp_path / "data"), writable=True),)) == (
        Root(str(tmp_path / "data"), writable=True),)
    with pytest.raises(SandboxPermissionError, match="not beneath a root this service allows"):
        config.checked_roots((Root(str(tmp_path)),))


def test_an_unknown_template_key_is_refused(tmp_path):
    path = tmp_path / "service.toml"
    path.write_text("[templates.default]\nmemory = 1\n")
    with pytest.raises(ValueError, match="unknown keys \\['memory'\\]"):
        ServiceConfig.load(path, image="base:1")


def test_only_a_create_that_changes_nothing_may_come_from_the_pool():
    template = ServiceConfig.load(None, image="base:1", pool=1).template("")
    assert Overrides().none
    assert not Overrides(labels={"a": "b"}).none and not Overrides(workspace=True).none
    changed = Overrides(memory_bytes=128 << 20, allow=()).applied(template)
    assert (changed.memory_bytes, changed.allow, changed.pool, changed.image) == (128 << 20, (), 0, "base:1")


def test_a_container_name_holds_the_owner_and_the_id():
    assert owner_of(container_name("svc.a", "t1", "abc"), "svc.a") == ("t1", "abc")
    assert owner_of(container_name("svc", "", "abc"), "svc") == ("pool", "abc")
    assert owner_of("svc-other.t1.abc", "svc") is None and owner_of("svc.t1.abc.d", "svc") is None


def test_a_swarm_table_names_the_manager_the_gateways_and_their_token(tmp_path):
    (tmp_path / "token").write_text("secret\n")
    path = tmp_path / "service.toml"
    path.write_text(f"""
[swarm]
manager = "tcp://10.0.0.1:2376"
gateway_token_file = "{tmp_path / 'token'}"
[swarm.nodes."node-1"]
gateway = "10.0.0.11:7443"
fingerprint = "sha256:{'ab' * 32}"
""")
    swarm = ServiceConfig.load(path, image="base:1").swarm
    assert swarm is not None and swarm.manager == "tcp://10.0.0.1:2376" and swarm.token() == "secret"
    assert swarm.gateways == {"node-1": NodeGateway("10.0.0.11:7443", f"sha256:{'ab' * 32}")}
    assert swarm.lease_seconds == 600  # a killed service's Swarm sandboxes go 10 minutes after its last renewal
    assert ServiceConfig.load(None, image="base:1").swarm is None


@pytest.mark.parametrize(("table", "refusal"), [
    ('[swarm]\nmanager = "unix:///m.sock"\n', "needs gateway_token_file, nodes"),
    ('[swarm]\nmanager = "m"\ngateway_token_file = "t"\nnodes = {n = {gateway = "a:1"}}\n',
     "needs exactly gateway and fingerprint"),
    ('[swarm]\nmanager = "m"\ngateway_token_file = "t"\nnodes = {}\nnetwork = "x"\n', "unknown keys"),
    ('[swarm]\nmanager = "m"\ngateway_token_file = "t"\nnodes = {}\nlease_seconds = 1\n', "3 or more"),
])
def test_a_swarm_table_that_cannot_be_used_is_refused(tmp_path, table, refusal):
    path = tmp_path / "service.toml"
    path.write_text(table)
    with pytest.raises(ValueError, match=refusal):
        ServiceConfig.load(path, image="base:1")


def test_a_swarm_service_name_has_no_dots_and_a_pool_members_says_pool():
    assert swarm_name("svc", "0123", "abcd") == "svc-0123-abcd"
    assert swarm_name("svc", "", "abcd") == "svc-pool-abcd"


def test_a_template_on_swarm_keeps_a_warm_pool(tmp_path):
    path = tmp_path / "service.toml"
    path.write_text('[templates.default]\npool = 1\n[swarm]\nmanager = "m"\ngateway_token_file = "t"\nnodes = {}\n')
    assert ServiceConfig.load(path, image="base:1").template("").pool == 1


def _swarm_file(tmp_path, manager: str = "unix:///run/manager.sock") -> str:
    return (f'[swarm]\nmanager = "{manager}"\ngateway_token_file = "{tmp_path / "token"}"\n'
            f'[swarm.nodes."node-1"]\ngateway = "10.0.0.11:7443"\nfingerprint = "sha256:{"ab" * 32}"\n')


def test_a_swarm_file_replaces_the_configuration_files_table(tmp_path):
    config, swarm = tmp_path / "service.toml", tmp_path / "swarm.toml"
    config.write_text("[templates.default]\nmemory_mib = 256\n" + _swarm_file(tmp_path, "tcp://old:2376"))
    swarm.write_text(_swarm_file(tmp_path))
    loaded = ServiceConfig.load(config, image="base:1", swarm=swarm)
    assert loaded.swarm is not None and loaded.swarm.manager == "unix:///run/manager.sock"
    assert loaded.template("").memory_bytes == 256 << 20
    assert ServiceConfig.load(None, image="base:1", swarm=swarm).swarm == loaded.swarm


@pytest.mark.parametrize(("text", "refusal"), [
    ("[templates.default]\n", "has no \\[swarm\\] table"),
    ('[swarm]\nmanager = "m"\n', "needs gateway_token_file, nodes"),
    (None, "cannot read the Swarm file"),
])
def test_up_refuses_a_swarm_file_that_cannot_be_used_before_it_starts_anything(tmp_path, monkeypatch, capsys,
                                                                               text, refusal):
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(tmp_path))
    swarm = tmp_path / "swarm.toml"
    if text is not None:
        swarm.write_text(text)
    with pytest.raises(ValueError, match=refusal):
        ServiceConfig.load(None, image="base:1", swarm=swarm)
    name = "protolink-test-swarm-up"
    assert main(["up", "--name", name, "--swarm", str(swarm)]) == 1
    assert re.search(refusal, capsys.readouterr().err)
    assert sorted(path.name for path in tmp_path.iterdir()) == ([] if text is None else ["swarm.toml"])


def test_serve_and_up_take_a_swarm_file():
    from protolink.sandbox.service.daemon import parser

    assert parser().parse_args(["--swarm", "/etc/swarm.toml"]).swarm == Path("/etc/swarm.toml")
    assert "--swarm FILE" in _help(["up", "--help"])


def _help(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(argv)
    return out.getvalue()
