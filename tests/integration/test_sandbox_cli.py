"""``protolink-sandbox up | status | exec | down`` as a user types them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from protolink.sandbox.hostdirs import runtime_dir
from protolink.sandbox.service.files import ServiceFiles
from tests.conftest import TEST_NAME_PREFIX

pytestmark = pytest.mark.docker

NOBODY = 65534
ISO_AGO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(\d+ s ago\)"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != "PROTOLINK_SANDBOX_ROOTS"}
    return subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**environment, **env})


def down_and_forget(name: str) -> None:
    """``down``, then what the appliance's service keeps for a user after it (its tokens and
    audit log): a test leaves nothing of its own in this user's runtime directory."""
    cli("down", "--name", name)
    files = ServiceFiles.of(name)
    for kept in (files.tokens, files.default_token, files.audit):
        kept.unlink(missing_ok=True)


@pytest.fixture
def name(docker_client) -> Iterator[str]:
    """A name of the test's own; whatever ``up`` left under it is removed after the test."""
    name = f"{TEST_NAME_PREFIX}cli-{uuid.uuid4().hex[:8]}"
    yield name
    down_and_forget(name)


def test_up_status_exec_down(docker_client, sandbox_image, tmp_path, name):
    (tmp_path / "hello.txt").write_text("hello from the host\n")
    tmp_path.chmod(0o755)  # readable by the sandbox's command uid
    up = cli("up", "--name", name, "--root", f"{tmp_path}:ro")
    try:
        assert up.returncode == 0, up.stderr
        address = docker_client.containers.get(name).labels["io.protolink.address"]
        assert address.startswith("unix:///")
        assert f"{name} is up at {address}" in up.stdout
        assert f'from protolink.sandbox import connect; backend = await connect("{address}")' in up.stdout

        status = cli("status", "--name", name)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "health: serving" in status.stdout and f"root: {tmp_path} (read-only)" in status.stdout
        assert re.search(f"created {ISO_AGO}$", status.stdout, re.MULTILINE), status.stdout
        # a reader that stops early (`status | head -1`) ends it quietly, as a shell command would
        piped = subprocess.run(f"{sys.executable} -m protolink.sandbox.cli status --name {name} | head -1",
                               shell=True, capture_output=True, text=True, timeout=300)
        assert piped.stdout == status.stdout.splitlines(keepends=True)[0] and piped.stderr == ""

        shown = cli("exec", "--name", name, "--", "cat", str(tmp_path / "hello.txt"))
        assert (shown.returncode, shown.stdout) == (0, "hello from the host\n")
        # exec finds the appliance where `up` recorded it, without asking the engine
        without_engine = cli("exec", "--name", name, "--", "true", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
        assert without_engine.returncode == 0, without_engine.stderr
        failed = cli("exec", "--name", name, "--cwd", str(tmp_path), "--", "/bin/sh", "-c", "exit 7")
        assert failed.returncode == 7

        again = cli("up", "--name", name, "--root", str(tmp_path))
        assert "already up" in again.stderr
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0 and f"{name} removed" in down.stdout
    assert cli("status", "--name", name).returncode == 3
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert not (runtime_dir() / f"{name}.json").exists()


def test_up_without_roots_mounts_a_default_workspace_commands_can_write(docker_client, sandbox_image, tmp_path, name):
    up = cli("up", "--name", name, XDG_DATA_HOME=str(tmp_path / "data"))
    assert up.returncode == 0, up.stderr
    workspace = tmp_path / "data" / "protolink" / "workspace"
    assert f"workspace: {workspace} (read-write; commands run as uid {NOBODY})" in up.stdout
    made = cli("exec", "--name", name, "--cwd", str(workspace), "--", "/bin/sh", "-c", "echo made > made.txt")
    assert made.returncode == 0, made.stderr
    assert (workspace / "made.txt").read_text() == "made\n" and (workspace / "made.txt").stat().st_uid == NOBODY


def test_a_writable_root_commands_cannot_write_is_refused_unless_handed_over(docker_client, sandbox_image, tmp_path,
                                                                             name):
    root = tmp_path / "ws"
    root.mkdir(mode=0o755)  # root's, as /srv/ws would be
    refused = cli("up", "--name", name, "--root", f"{root}:rw")
    assert refused.returncode == 1
    assert f"writable root {root} cannot be written by uid {NOBODY}" in refused.stderr
    assert f"fix it with: chown {NOBODY}:{NOBODY} {root}" in refused.stderr and "--chown-writable" in refused.stderr
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert root.stat().st_uid == 0

    up = cli("up", "--name", name, "--root", f"{root}:rw", "--chown-writable")
    assert up.returncode == 0, up.stderr
    assert f"handed writable root {root} to {NOBODY}:{NOBODY} (it was 0:0)" in up.stderr
    made = cli("exec", "--name", name, "--cwd", str(root), "--", "/bin/sh", "-c", "echo made > made.txt")
    assert made.returncode == 0 and (root / "made.txt").read_text() == "made\n", made.stderr


# exec: what a command writes, how it ends, and where it runs ------------------------------


def exec_bytes(name: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``protolink-sandbox exec --name NAME ARGS...`` with its output as bytes."""
    return subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", "exec", "--name", name, *args],
                          capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def appliance(docker_client, sandbox_image, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """An appliance over a read-only root holding every byte value and output at the cap and past it."""
    root = tmp_path_factory.mktemp("exec-root")
    root.chmod(0o755)
    (root / "bytes").write_bytes(bytes(range(256)) * 4)
    (root / "at-cap").write_bytes(os.urandom(CAP))
    (root / "past-cap").write_bytes((root / "at-cap").read_bytes() + b"!")
    for path in root.iterdir():
        path.chmod(0o644)
    name = f"{TEST_NAME_PREFIX}cli-exec-{uuid.uuid4().hex[:8]}"
    up = cli("up", "--name", name, "--root", f"{root}:ro")
    try:
        assert up.returncode == 0, up.stderr
        yield name, root
    finally:
        down_and_forget(name)


CAP = 1 << 20  # the --max-output-bytes the tests of the cap give


def test_exec_writes_the_commands_bytes_exactly(appliance):
    name, root = appliance
    binary = exec_bytes(name, "--", "/bin/sh", "-c", f"cat {root}/bytes; cat {root}/bytes >&2")
    assert (binary.returncode, binary.stdout, binary.stderr) == (0, (root / "bytes").read_bytes(),
                                                                 (root / "bytes").read_bytes())
    at_cap = exec_bytes(name, "--max-output-bytes", str(CAP), "--", "cat", str(root / "at-cap"))
    assert (at_cap.returncode, at_cap.stdout, at_cap.stderr) == (0, (root / "at-cap").read_bytes(), b"")
    past_cap = exec_bytes(name, "--max-output-bytes", str(CAP), "--", "cat", str(root / "past-cap"))
    assert (past_cap.returncode, past_cap.stdout) == (0, (root / "at-cap").read_bytes())
    assert past_cap.stderr == b"protolink-sandbox: output truncated\n"
    whole = exec_bytes(name, "--", "cat", str(root / "past-cap"))  # by default, as much as the appliance allows
    assert (whole.returncode, whole.stdout, whole.stderr) == (0, (root / "past-cap").read_bytes(), b"")
    smaller = exec_bytes(name, "--max-output-bytes", "300", "--", "/bin/sh", "-c", f"cat {root}/bytes >&2")
    assert (smaller.stdout, smaller.stderr) == (b"", bytes(range(256)) + bytes(range(44)) +
                                                b"protolink-sandbox: output truncated\n")


def test_exec_ends_as_its_command_ends_in_a_shell(appliance):
    name, root = appliance
    assert exec_bytes(name, "--", "/bin/sh", "-c", "exit 7").returncode == 7
    assert exec_bytes(name, "--", "/bin/sh", "-c", "exit 255").returncode == 255
    killed = exec_bytes(name, "--", "/bin/sh", "-c", "echo before; kill -KILL $$")
    assert (killed.returncode, killed.stdout) == (128 + 9, b"before\n")  # killed by signal N: 128 + N
    terminated = exec_bytes(name, "--", "/bin/sh", "-c", "kill -TERM $$")
    assert terminated.returncode == 128 + 15
    slow = exec_bytes(name, "--timeout", "1", "--", "sleep", "60")
    assert slow.returncode == 124  # as timeout(1)
    assert slow.stderr == b"protolink-sandbox: timed out after 1 s: sleep 60\n"
    long = exec_bytes(name, "--", "/bin/sh", "-c", 'echo $#; printf %s "$@" | wc -c', "sh", *["x" * 100_000] * 3)
    assert (long.returncode, long.stdout.split()) == (0, [b"3", b"300000"])  # more than a first window of request
    for flag in ("--cwd", "-w", "--workdir"):  # docker exec's -w and --workdir too
        where = exec_bytes(name, flag, str(root), "--", "pwd")
        assert (where.returncode, where.stdout) == (0, f"{root}\n".encode())


def test_exec_sets_the_variables_given_as_docker_exec_does(appliance, monkeypatch):
    name, _ = appliance
    monkeypatch.setenv("FROM_HOST", "host value")
    shown = exec_bytes(name, "-e", "GREETING=a=b c", "--env", "FROM_HOST", "--env", "HOME=/srv", "-e", "EMPTY=",
                       "--", "/bin/sh", "-c", 'printf "%s|%s|%s|%s|%s" "$GREETING" "$FROM_HOST" "$HOME" "${EMPTY-unset}" "$PATH"')
    assert (shown.returncode, shown.stdout) == (0, b"a=b c|host value|/srv||/usr/local/bin:/usr/bin:/bin")
    unset = exec_bytes(name, "--env", "NOT_SET_ON_THIS_HOST", "--", "true")
    assert unset.returncode == 2 and b"NOT_SET_ON_THIS_HOST is not set here" in unset.stderr
    nameless = exec_bytes(name, "-e", "=value", "--", "true")
    assert nameless.returncode == 2 and b"--env takes NAME=VALUE or NAME" in nameless.stderr
    quiet = exec_bytes(name, "--", "cat")  # its standard input is empty: it ends at once
    assert (quiet.returncode, quiet.stdout) == (0, b"")


def exec_fed(name: str, *args: str, stdin: bytes | list[str]) -> subprocess.CompletedProcess[bytes]:
    """:func:`exec_bytes` with ``stdin`` as its standard input: bytes, or the endless output of
    the command ``stdin`` names, through a pipe."""
    if isinstance(stdin, bytes):
        return subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", "exec", "--name", name, *args],
                              input=stdin, capture_output=True, timeout=300)
    with subprocess.Popen(stdin, stdout=subprocess.PIPE) as feeder:
        try:
            assert feeder.stdout is not None
            return subprocess.run([sys.executable, "-m", "protolink.sandbox.cli", "exec", "--name", name, *args],
                                  stdin=feeder.stdout, capture_output=True, timeout=300)
        finally:
            feeder.kill()


def test_exec_i_passes_its_standard_input_to_the_command_as_docker_exec_i_does(appliance):
    name, _ = appliance
    data = bytes(range(256)) * 64 + os.urandom(3 << 20)  # every byte value, and more than any window
    fed = exec_fed(name, "-i", "--", "cat", stdin=data)
    assert (fed.returncode, len(fed.stdout), fed.stdout == data, fed.stderr) == (0, len(data), True, b"")
    script = exec_fed(name, "-i", "--", "sh", stdin=b'echo "$((6 * 7))" >&2\nfor word in a b; do echo $word; done\nexit 5\n')
    assert (script.returncode, script.stdout, script.stderr) == (5, b"a\nb\n", b"42\n")
    half = exec_fed(name, "-i", "--", "head", "-c", str(1 << 20), stdin=data)  # reads a third, then exits
    assert (half.returncode, half.stdout == data[:1 << 20], half.stderr) == (0, True, b"")
    empty = exec_fed(name, "-i", "--", "wc", "-c", stdin=b"")
    assert (empty.returncode, empty.stdout) == (0, b"0\n")
    without = exec_fed(name, "--", "cat", stdin=b"not passed")  # without -i, its standard input stays empty
    assert (without.returncode, without.stdout) == (0, b"")
    closed = subprocess.run(["/bin/sh", "-c", 'exec "$@" <&-', "sh", sys.executable, "-m", "protolink.sandbox.cli",
                             "exec", "--name", name, "-i", "--", "cat"], capture_output=True, timeout=300)
    assert (closed.returncode, closed.stdout, closed.stderr) == (0, b"", b"")  # a closed one is empty


def test_exec_i_ends_with_its_command_however_much_input_is_left(appliance):
    name, _ = appliance
    unread = exec_fed(name, "-i", "--", "true", stdin=["cat", "/dev/zero"])
    assert (unread.returncode, unread.stderr) == (0, b"")
    never_read = exec_fed(name, "-i", "--", "sh", "-c", "sleep 2; echo slept", stdin=["yes"])  # its pipe fills
    assert (never_read.returncode, never_read.stdout, never_read.stderr) == (0, b"slept\n", b"")
    slow = exec_fed(name, "-i", "--timeout", "2", "--", "sleep", "60", stdin=["yes"])
    assert (slow.returncode, slow.stderr) == (124, b"protolink-sandbox: timed out after 2 s: sleep 60\n")
    listed = exec_bytes(name, "--", "/bin/sh", "-c", "cat /proc/[0-9]*/cmdline; true")
    assert listed.returncode == 0 and b"sleep\x0060" not in listed.stdout  # the timed-out command is gone
    after = exec_fed(name, "-i", "--", "cat", stdin=b"still served")
    assert (after.returncode, after.stdout) == (0, b"still served")


def test_exec_of_a_command_that_cannot_start_says_why(appliance):
    name, _ = appliance
    looked_up = exec_bytes(name, "--", "no-such-command")  # looked up on PATH inside the appliance
    assert looked_up.returncode == 127 and b"no-such-command" in looked_up.stderr
    missing = exec_bytes(name, "--", "/no/such/file")
    assert missing.returncode == 126  # as docker exec: it could not be started
    assert missing.stderr == b"protolink-sandbox: could not start '/no/such/file' in '/tmp': No such file or directory\n"
    nowhere = exec_bytes(name, "--cwd", "/no/such/directory", "--", "true")
    assert nowhere.returncode == 126
    assert nowhere.stderr == (b"protolink-sandbox: could not start 'true' in '/no/such/directory': "
                              b"its working directory: No such file or directory\n")  # as typed


def test_exec_without_an_appliance_exits_3(docker_client):
    absent = exec_bytes(f"{TEST_NAME_PREFIX}cli-absent-{uuid.uuid4().hex[:8]}", "--", "true")
    assert absent.returncode == 3 and absent.stdout == b""
    assert absent.stderr.endswith(b" is not up: run `protolink-sandbox up` first\n")


def test_exec_over_tcp_speaks_tls_pinned_sends_the_token_and_a_wrong_one_is_refused(docker_client, sandbox_image,
                                                                                       tmp_path, name):
    tmp_path.chmod(0o755)
    up = cli("up", "--name", name, "--root", str(tmp_path), "--tcp", "127.0.0.1:0")
    assert up.returncode == 0, up.stderr
    record_path = runtime_dir() / f"{name}.json"
    fingerprint = json.loads(record_path.read_text())["fingerprint"]
    assert f"tls: {fingerprint} " in up.stdout and f"fingerprint={fingerprint!r})" in up.stdout
    assert f"tls: {fingerprint} " in cli("status", "--name", name).stdout
    shown = exec_bytes(name, "--", "/bin/sh", "-c", "echo over tcp; exit 4")
    assert (shown.returncode, shown.stdout) == (4, b"over tcp\n"), shown.stderr
    record = record_path.read_text()
    record_path.write_text(record.replace(fingerprint, "sha256:" + "0" * 64))
    impostor = exec_bytes(name, "--", "/bin/sh", "-c", "echo ran")
    assert (impostor.returncode, impostor.stdout) == (125, b"")  # not the certificate it pins: nothing sent
    assert b"presents the certificate " + fingerprint.encode() in impostor.stderr
    record_path.write_text(record)
    (runtime_dir() / f"{name}.token").write_text("wrong")
    refused = exec_bytes(name, "--", "/bin/sh", "-c", "echo ran")
    assert (refused.returncode, refused.stdout) == (125, b"")  # the sandbox's own failure
    assert refused.stderr == b"protolink-sandbox: missing or wrong token\n"
