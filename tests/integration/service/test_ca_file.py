"""A service template's CA file (``ca_file``) on this host's network, which intercepts TLS (the
package index is signed by an authority in the host's bundle only): a sandbox of the template,
cold or from the warm pool, trusts a copy of the bundle, so pip installs from the index, where a
sandbox of a template without it fails on the certificate. A killed service's next run adopts
such a sandbox, which still trusts its copy; the copy goes with the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protolink.errors import CaFileError
from protolink.sandbox.leftovers import HOSTDIRS_LABEL
from protolink.sandbox.placements.server import CA_NAME, CA_PATH
from protolink.sandbox.service import labels
from protolink.wire.trust import CA_VARIABLES
from tests.integration.service.test_lifecycle import eventually
from tests.integration.test_sandbox_ca_file import HOST_BUNDLE, SHOW_TRUST, index, pip_install  # noqa: F401
from tests.security.test_egress import PACKAGE, Index
from tests.unit.sandbox.test_ca_file import bundle  # noqa: F401 (a fixture)

pytestmark = pytest.mark.docker

#: A command that fetches the index's page of :data:`PACKAGE` with Python's default trust (and the
#: proxy's variables), printing ``fetched`` or the error.
FETCH = """
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=60).read()
    print("fetched")
except OSError as error:
    print(error)
"""


def service_config(path: Path, index: Index, *, pool: int = 0) -> Path:
    """A configuration whose default template trusts the host's bundle and whose ``plain`` one does
    not, both allowed only the package index's hosts."""
    allow = json.dumps([f"{index.host}:443", f"{index.files_host}:443"])
    path.write_text(f'[templates.default]\nallow = {allow}\nca_file = "{HOST_BUNDLE}"\npool = {pool}\n'
                    f'[templates.plain]\nallow = {allow}\n')
    return path


def page(index: Index) -> str:
    return f"{index.url.rstrip('/')}/{PACKAGE}/"


async def trust_of(run, backend) -> dict[str, str | None]:
    shown = await run(backend, ["/usr/bin/python3", "-c", SHOW_TRUST])
    return json.loads(shown.stdout)


async def test_a_templates_sandboxes_cold_and_pooled_trust_its_ca_file(make_service, tmp_path, index, run):
    service = make_service("--config", str(service_config(tmp_path / "service.toml", index, pool=1)))
    client = await service.client()

    async def one_ready():
        return (await client.pool_ready()).get("default") == 1

    await eventually(one_ready, "one pooled sandbox ready")
    async with await client.create() as pooled, await client.create(workspace=True) as cold, \
            await client.create("plain") as plain:
        assert pooled.status.pooled and not cold.status.pooled
        for sandbox in (pooled, cold):
            assert await trust_of(run, sandbox.backend) == dict.fromkeys(CA_VARIABLES, CA_PATH)
            read = await run(sandbox.backend, ["/bin/cat", CA_PATH])
            assert read.stdout == Path(HOST_BUNDLE).read_text(), read.stderr
        fetched = await run(pooled.backend, ["/usr/bin/python3", "-c", FETCH, page(index)], timeout=90)
        assert fetched.stdout == "fetched\n", fetched
        refused = await run(plain.backend, ["/usr/bin/python3", "-c", FETCH, page(index)], timeout=90)
        assert "CERTIFICATE_VERIFY_FAILED" in refused.stdout, refused  # this network needs the CA file
        venv = Path(cold.status.workspace) / "venv"
        made = await run(cold.backend, ["/usr/bin/python3", "-m", "venv", str(venv)], timeout=300)
        assert made.exit_code == 0, made
        installed = await run(cold.backend, pip_install(index, venv), cwd=cold.status.workspace, timeout=300)
        assert installed.exit_code == 0, f"pip install {PACKAGE} failed:\n{installed.stdout}{installed.stderr}"


async def test_an_adopted_sandbox_still_trusts_its_copy_which_goes_with_it(make_service, docker_client, tmp_path,
                                                                            index, run):
    service = make_service("--config", str(service_config(tmp_path / "service.toml", index)))
    client = await service.client()
    kept = await client.create()
    service.kill()
    service.start()
    client = await service.client()
    again = await client.open(kept.id)
    assert await trust_of(run, again.backend) == dict.fromkeys(CA_VARIABLES, CA_PATH)
    fetched = await run(again.backend, ["/usr/bin/python3", "-c", FETCH, page(index)], timeout=90)
    assert fetched.stdout == "fetched\n", fetched
    [container] = docker_client.api.containers(filters={"label": f"{labels.SERVICE}={service.name}"})
    copy = Path(container["Labels"][HOSTDIRS_LABEL]) / CA_NAME
    assert copy.read_bytes() == Path(HOST_BUNDLE).read_bytes()
    await again.delete()
    await kept.backend.aclose()
    assert not copy.exists()


async def test_a_ca_file_gone_after_the_start_fails_the_create_and_nothing_else(make_service, docker_client,
                                                                               tmp_path, bundle, run):
    """The operator removed or broke a template's CA file while the service runs: a create of that
    template fails with CaFileError naming the file, leaves no container, and the service serves
    its other templates."""
    config = tmp_path / "service.toml"
    config.write_text(f'[templates.default]\n[templates.intercepted]\nca_file = "{bundle}"\n')
    service = make_service("--config", str(config))
    client = await service.client()
    for break_it in (bundle.unlink, lambda: bundle.write_text("not a certificate\n")):
        break_it()
        with pytest.raises(CaFileError, match=str(bundle)):
            await client.create("intercepted")
        assert docker_client.api.containers(all=True, filters={"label": f"{labels.SERVICE}={service.name}"}) == []
    async with await client.create() as plain:
        assert (await run(plain.backend, ["/bin/true"])).exit_code == 0
