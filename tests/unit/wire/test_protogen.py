"""The generated code in protolink/wire/_pb matches the .proto files in proto/."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from protolink.wire import protogen


def test_generated_code_is_current(tmp_path: Path):
    written = protogen.generate(tmp_path)
    fresh = {path.name: path.read_text() for path in written}
    committed = {path.name: path.read_text() for path in protogen.PACKAGE_DIR.iterdir() if path.is_file()}
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"stale generated code {stale}: run `make proto`"


def test_every_rpc_of_the_contract_is_served():
    from protolink_sandboxd.config import ServerConfig
    from protolink_sandboxd.service import SERVICE, SandboxService

    from protolink.wire._pb import sandbox_pb2

    handler = SandboxService(ServerConfig(listen="unix:///x", roots=(), boundary="sandbox:x"), None, None, None).handler()
    for method in sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].methods:
        details = SimpleNamespace(method=f"/{SERVICE}/{method.name}", invocation_metadata=())
        assert handler.service(details) is not None, method.name


def test_every_rpc_but_the_services_own_is_an_operation_of_the_table():
    from protolink.wire._pb import sandbox_pb2
    from protolink.wire.operations import WIRE_OPERATIONS

    contract = {method.name for method in sandbox_pb2.DESCRIPTOR.services_by_name["Sandbox"].methods}
    assert set(WIRE_OPERATIONS) <= contract
    assert contract - set(WIRE_OPERATIONS) == {"Info", "Execute", "ResolveCommand", "Upload", "Download"}
