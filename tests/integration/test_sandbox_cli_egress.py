"""``protolink-sandbox up --allow | egress | down`` as a user types them: a detached daemon per
appliance proxies its commands' connections, changes its policy live, logs its decisions, and
ends with the appliance. Loopback is reachable only through the test-only opt-in
``PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK=1``, since the test's server listens there."""

from __future__ import annotations

import http.server
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from protolink.sandbox.egress.control import EgressFiles
from protolink.sandbox.leftovers import owner_gone
from tests.integration.test_sandbox_cli import cli, name  # noqa: F401 (a fixture)

pytestmark = pytest.mark.docker

TEST_ONLY = {"PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK": "1"}
#: A plain-HTTP GET through the proxy that HTTP_PROXY names (urllib would go direct: NO_PROXY
#: lists 127.0.0.1); a refusal exits non-zero with the proxy's status.
FETCH = ("import os, sys, http.client, urllib.parse\n"
         "proxy = urllib.parse.urlsplit(os.environ['HTTP_PROXY'])\n"
         "connection = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=20)\n"
         "connection.request('GET', sys.argv[1])\n"
         "answer = connection.getresponse()\n"
         "body = answer.read().decode()\n"
         "print(body) if answer.status == 200 else sys.exit(f'{answer.status} {answer.reason}: {body}')")


class _Hello(http.server.BaseHTTPRequestHandler):
    """``/``: a greeting; ``/slow``: 1 KB every 0.1 s for a minute (a download to cut)."""

    def do_GET(self) -> None:
        body = b"hello through the proxy"
        slow = self.path == "/slow"
        self.send_response(200)
        self.send_header("Content-Length", str(600 * 1024 if slow else len(body)))
        self.end_headers()
        if not slow:
            self.wfile.write(body)
            return
        try:
            for _ in range(600):
                self.wfile.write(b"x" * 1024)
                self.wfile.flush()
                time.sleep(0.1)
        except OSError:
            pass  # the proxy closed it

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    """A loopback HTTP server on this host; its port."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def daemon_owner(name: str) -> tuple[int, str]:
    record = json.loads(EgressFiles.of(name).pid.read_text())
    return record["pid"], record["owner"]


def log_of(name: str) -> str:
    return cli("egress", "--name", name, "--log").stdout


def wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.2)


def wait_gone(owner: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not owner_gone(owner):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_allow_fetch_deny_all_refused_and_logged_then_down_leaves_nothing(docker_client, sandbox_image, tmp_path,
                                                                          name, server):
    tmp_path.chmod(0o755)
    rule = f"127.0.0.1/32:{server}"
    url = f"http://127.0.0.1:{server}/"
    up = cli("up", "--name", name, "--root", f"{tmp_path}:ro", f"--allow={rule}", **TEST_ONLY)
    assert up.returncode == 0, up.stderr
    assert f"egress: allow {rule} (daemon pid" in up.stderr
    files = EgressFiles.of(name)
    pid, owner = daemon_owner(name)
    assert not owner_gone(owner) and os.getsid(pid) == pid  # it outlived `up`, in a session of its own
    assert stat.S_IMODE(files.socket.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.socket.parent.stat().st_mode) == 0o700

    status = cli("status", "--name", name)
    assert status.returncode == 0 and f"egress: allow {rule} (daemon pid {pid}" in status.stdout, status.stdout

    fetched = cli("exec", "--name", name, "--", "python3", "-c", FETCH, url)
    assert (fetched.returncode, fetched.stdout) == (0, "hello through the proxy\n"), fetched.stderr

    downloading = subprocess.Popen([sys.executable, "-m", "protolink.sandbox.cli", "exec", "--name", name, "--",
                                    "python3", "-c", FETCH, f"{url}slow"], stdout=subprocess.PIPE, text=True)
    wait_for(lambda: log_of(name).splitlines()[-1].split()[1] == "allowed", 60)  # the download runs
    denied = cli("egress", "--name", name, "--deny-all")
    assert denied.returncode == 0 and "egress now denies everything" in denied.stdout, denied.stderr
    assert downloading.wait(timeout=30) != 0  # cut, not finished (that would take a minute)
    assert re.search(rf"closed   127\.0\.0\.1:{server}  .* deny-all$", log_of(name), re.MULTILINE), log_of(name)
    refused = cli("exec", "--name", name, "--", "python3", "-c", FETCH, url)
    assert refused.returncode != 0 and "hello" not in refused.stdout
    assert "egress: deny all" in cli("status", "--name", name).stdout

    log = cli("egress", "--name", name, "--log")
    assert log.returncode == 0, log.stderr
    lines = log.stdout.splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert any(re.match(rf"{stamp}  allowed  127\.0\.0\.1:{server}  ", line) for line in lines), log.stdout
    assert re.match(rf"{stamp}  denied   127\.0\.0\.1:{server}  ", lines[-1]), log.stdout

    bad = cli("egress", "--name", name, "--allow", "no spaces allowed")
    assert bad.returncode == 1 and "no spaces allowed" in bad.stderr
    reopened = cli("egress", "--name", name, f"--allow={rule}")
    assert reopened.returncode == 0 and f"egress now allow {rule}" in reopened.stdout, reopened.stderr
    again = cli("exec", "--name", name, "--", "python3", "-c", FETCH, url)
    assert again.returncode == 0, again.stderr
    shown = cli("egress", "--name", name)
    assert f"{name}: egress allow {rule} (daemon pid {pid}, decisions in {files.events})" in shown.stdout, shown.stderr

    down = cli("down", "--name", name)
    assert down.returncode == 0 and f"stopped the egress daemon of {name}" in down.stderr, down.stderr
    assert owner_gone(owner)
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert [path for path in files.all() if path.exists()] == []  # the logs too
    started = time.monotonic()
    gone = cli("egress", "--name", name, "--deny-all")
    assert gone.returncode == 1 and f"{name} has no egress daemon: start it with" in gone.stderr
    assert time.monotonic() - started < 30  # an answer, not a hang (the interpreter's start included)


def test_the_daemon_ends_by_itself_once_the_container_is_gone(docker_client, sandbox_image, tmp_path, name, server):
    tmp_path.chmod(0o755)
    up = cli("up", "--name", name, "--root", f"{tmp_path}:ro", f"--allow=127.0.0.1/32:{server}", **TEST_ONLY)
    assert up.returncode == 0, up.stderr
    _, owner = daemon_owner(name)
    container = docker_client.containers.get(name)
    channel_dir = container.labels["io.protolink.hostdirs"]
    container.remove(force=True)  # behind the CLI's back
    assert wait_gone(owner, 30), EgressFiles.of(name).log.read_text()
    assert "is gone" in EgressFiles.of(name).log.read_text()  # kept until `down`, for whoever asks why
    assert not EgressFiles.of(name).socket.exists()
    down = cli("down", "--name", name)
    assert down.returncode == 0 and "is not up" in down.stderr
    assert not os.path.exists(channel_dir) and not EgressFiles.of(name).log.exists()


def test_an_appliance_without_allow_has_no_daemon_and_no_proxy(docker_client, sandbox_image, tmp_path, name):
    tmp_path.chmod(0o755)
    up = cli("up", "--name", name, "--root", f"{tmp_path}:ro")
    assert up.returncode == 0, up.stderr
    assert "egress" not in up.stderr and not EgressFiles.of(name).pid.exists()
    assert "egress: none (no network)" in cli("status", "--name", name).stdout
    env = cli("exec", "--name", name, "--", "env")
    assert "PROXY" not in env.stdout.upper(), env.stdout
    for args in (["--allow", "pypi.org"], []):
        refused = cli("egress", "--name", name, *args)
        assert refused.returncode == 1 and f"{name} has no egress daemon: start it with" in refused.stderr
