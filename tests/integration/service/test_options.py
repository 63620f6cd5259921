"""What a create may ask beyond its template: host roots the service allows, and egress."""

from __future__ import annotations

import pytest

from protolink.errors import RootNotWritableError, SandboxPermissionError

pytestmark = pytest.mark.docker


async def test_a_create_mounts_only_host_roots_the_configuration_allows(make_service, tmp_path, run):
    allowed = tmp_path / "data"
    allowed.mkdir()
    allowed.chmod(0o755)
    (allowed / "input.txt").write_text("shared input\n")
    (allowed / "input.txt").chmod(0o644)
    config = tmp_path / "service.toml"
    config.write_text(f'allowed_roots = ["{allowed}"]\n')
    service = make_service("--config", str(config))
    client = await service.client()
    async with await client.create(roots=[f"{allowed}:ro"]) as sandbox:
        read = await run(sandbox.backend, ["/bin/cat", str(allowed / "input.txt")])
        assert (read.exit_code, read.stdout) == (0, "shared input\n")
    with pytest.raises(SandboxPermissionError, match="not beneath a root this service allows"):
        await client.create(roots=[str(tmp_path)])
    assert await client.list() != [] and all(status.state == "deleted" for status in await client.list())
    with pytest.raises(RootNotWritableError, match=f"{allowed}.*uid") as refused:
        await client.create(roots=[f"{allowed}:rw"])  # root's, 0755: the command user cannot write it
    assert refused.value.path == str(allowed) and refused.value.fix in str(refused.value)
    assert (refused.value.uid, refused.value.gid) != (0, 0)
    assert all(status.state == "deleted" for status in await client.list())


async def test_egress_rules_give_a_sandbox_its_proxy_and_none_gives_it_nothing(service, run):
    client = await service.client()
    async with await client.create(allow=[]) as relayed, await client.create() as closed:
        with_egress = await run(relayed.backend, ["/usr/bin/env"])
        without = await run(closed.backend, ["/usr/bin/env"])
    assert "HTTPS_PROXY=" in with_egress.stdout
    assert "HTTPS_PROXY=" not in without.stdout
