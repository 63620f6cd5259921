"""The CI runner against hostile repositories: ``protolink-sandbox ci`` as a pipeline runs it.

Each test writes a repository into its ``tmp_path`` and runs it through the real command line
in a subprocess (``--image sandbox``; ``--runtime`` follows ``PROTOLINK_SANDBOX_RUNTIME``), with
canary variables in the runner's environment and ``PROTOLINK_CI_DIR`` a directory of the test's
own. Every job must end reported as it happened (outcome, exit code, the report's fields) and
leave nothing: no container, no job directory, no process, and the user's checkout unchanged.
The servers a job may reach listen on this host's loopback, opened only by the test-only
``PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK=1``.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from protolink.sandbox.ci.progress import MAX_PENDING_LINE
from protolink.sandbox.ci.report import (
    EXIT_INTERRUPTED,
    EXIT_REPOSITORY,
    EXIT_TERMINATED,
    EXIT_TIMED_OUT,
)

from tests.conftest import TEST_NAME_PREFIX

from .conftest import CANARY, CANARY_VARIABLE, GVISOR, RUNTIME, figure

pytestmark = pytest.mark.docker

#: A variable the job names with --env: it reaches the commands, masked in all they print.
SECRET_VARIABLE = "PROTOLINK_CI_SECRET"
SECRET = f"secret-{secrets.token_hex(8)}"
#: The test-only opt-in that lets an allow-list reach this host's loopback.
LOOPBACK = {"PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK": "1"}
#: Bound on a whole job run in these tests: only a hang guard.
JOB_GUARD = 300.0
MiB = 1 << 20
#: A test command that prints its $0 (a marker, also in its command line) and sleeps an hour.
SLEEP = 'echo "$0"; sleep 3600'


@dataclass
class Job:
    """A finished run of the command line: its exit status, output and report."""

    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any]
    report_text: str

    def command(self, phase: str, index: int = 0) -> dict[str, Any]:
        return next(p for p in self.report["phases"] if p["name"] == phase)["commands"][index]


@dataclass
class Runner:
    """Runs ``protolink-sandbox ci`` for one test; ``jobs`` is its PROTOLINK_CI_DIR."""

    tmp: Path
    jobs: Path
    report: Path
    artifacts: Path

    def argv(self, repo: Path | str, *options: str, test: list[str]) -> list[str]:
        runtime = ["--runtime", RUNTIME] if RUNTIME else []
        return [sys.executable, "-m", "protolink.sandbox.cli", "ci", str(repo), "--image", "sandbox", *runtime,
                "--report", str(self.report), "--artifacts-dir", str(self.artifacts), *options, "--", *test]

    def env(self, **extra: str) -> dict[str, str]:
        environment = {key: value for key, value in os.environ.items() if key != "PROTOLINK_SANDBOX_ROOTS"}
        return {**environment, CANARY_VARIABLE: CANARY, SECRET_VARIABLE: SECRET,
                "PROTOLINK_CI_DIR": str(self.jobs), **extra}

    def run(self, repo: Path | str, *options: str, test: list[str], **env: str) -> Job:
        done = subprocess.run(self.argv(repo, *options, test=test), capture_output=True, text=True,
                              env=self.env(**env), timeout=JOB_GUARD, stdin=subprocess.DEVNULL)
        return self.finished(done.returncode, done.stdout, done.stderr)

    def start(self, repo: Path | str, *options: str, test: list[str], **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(repo, *options, test=test), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env(**env), stdin=subprocess.DEVNULL)

    def finished(self, returncode: int, stdout: str, stderr: str) -> Job:
        text = self.report.read_text()
        return Job(returncode, stdout, stderr, json.loads(text), text)


@pytest.fixture
def runner(tmp_path: Path, sandbox_image: str) -> Runner:
    return Runner(tmp_path, tmp_path / "jobs", tmp_path / "report.json", tmp_path / "artifacts")


def repository(path: Path, files: dict[str, str], *, git: bool = False) -> Path:
    """A checkout at ``path`` holding ``files`` (a commit of them with ``git``)."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(textwrap.dedent(text))
    if git:
        _git(path, "init", "--quiet", "--initial-branch=main")
        _git(path, "add", "--all")
        _git(path, "commit", "--quiet", "--message", "hostile")
    return path


def _git(cwd: Path, *args: str, input_text: str | None = None) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True,
                          input=input_text).stdout


def tree_state(top: Path) -> str:
    """A digest of everything beneath ``top``: names, types, modes, owners, times, contents, link targets."""
    digest = hashlib.sha256()
    for directory, names, files in os.walk(top):
        names.sort()
        for name in sorted(names + files):
            path = os.path.join(directory, name)
            info = os.lstat(path)
            digest.update(f"{os.path.relpath(path, top)}\0{info.st_mode}\0{info.st_uid}\0{info.st_mtime_ns}\0".encode())
            if stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(path).encode())
            elif stat.S_ISREG(info.st_mode):
                digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def host_processes(marker: str) -> list[int]:
    """Pids of this host whose command line holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
    return found


def assert_nothing_left(runner: Runner, job: Job, docker_client: Any, *markers: str) -> None:
    """No job directory, no container of the job, no process holding one of ``markers``."""
    assert list(runner.jobs.iterdir()) == []
    container = job.report["container"]
    assert container, job.report
    assert docker_client.containers.list(all=True, filters={"id": container}) == []
    for marker in markers:
        assert host_processes(marker) == []


def assert_secrets_absent(job: Job) -> None:
    for text in (job.stdout, job.stderr, job.report_text):
        assert CANARY not in text and SECRET not in text


# -- the environment, and writes outside the workspace -------------------------------------------

ESCAPE = """\
import errno, hashlib, json, os, subprocess, sys, time
from pathlib import Path

print("environment:", dict(os.environ))
print("own environ:", open("/proc/self/environ", "rb").read())
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            print("environ of", pid, open(f"/proc/{pid}/environ", "rb").read())
        except OSError as error:
            print("environ of", pid, "unreadable:", error.errno)
secret = os.environ.get("PROTOLINK_CI_SECRET", "")
print("secret sha256:", hashlib.sha256(secret.encode()).hexdigest())
print("secret itself:", secret, file=sys.stderr)

TOKEN = sys.argv[1]
CHECKOUT = sys.argv[2]
targets = [f"/{TOKEN}", f"/etc/{TOKEN}", "/etc/passwd", f"/opt/protolink/{TOKEN}", f"/usr/local/bin/{TOKEN}",
           f"/root/{TOKEN}", f"/var/{TOKEN}", f"{CHECKOUT}/{TOKEN}", f"{CHECKOUT}/test_escape.py",
           str(Path.cwd().parent.parent / "owner"), str(Path.cwd().parent.parent / TOKEN),
           "/proc/sysrq-trigger", "/sys/fs/cgroup/cgroup.procs", f"/sys/fs/cgroup/{TOKEN}"]
outcome = {}
for target in targets:
    try:
        with open(target, "a") as handle:
            handle.write("h" if target.startswith("/proc") else "written by the job\\n")
        outcome[target] = "written"
    except OSError as error:
        outcome[target] = errno.errorcode.get(error.errno, str(error.errno))
script = Path(f"/tmp/{TOKEN}.sh")
script.write_text("#!/bin/sh\\necho ran from /tmp\\n")
script.chmod(0o755)
try:
    outcome["exec /tmp"] = subprocess.run([str(script)], capture_output=True, text=True).stdout or "no output"
except OSError as error:
    outcome["exec /tmp"] = errno.errorcode.get(error.errno, str(error.errno))
Path("test_escape.py").write_text("overwritten in the workspace\\n")
Path("planted.txt").write_text("planted in the workspace\\n")
print("outcome:", json.dumps(outcome), flush=True)
while not Path("go").exists():  # the host looks at its side first, then writes it
    time.sleep(0.05)
"""


def test_ci_job_sees_no_host_variable_and_writes_nothing_outside_its_workspace(runner, docker_client, tmp_path):
    """A repository's test prints its whole environment (and every readable /proc/*/environ) and
    the value of a variable passed with --env, then writes to /, /etc, /opt/protolink, the
    checkout's host path, the job directory, /proc/sysrq-trigger and the cgroup files, execs a
    script from /tmp, and overwrites its own files.

    The runner's canary variable is nowhere in the output or the report; the passed variable
    reaches the test (its digest matches) and shows only as *** in the output and the report,
    which names it without its value. Every write outside the workspace is refused (under
    gVisor the job directory's path is the sandbox's own tmpfs, which takes them), /tmp is
    noexec, the host has none of the files, its job directory is untouched while the job runs,
    the checkout is unchanged and nothing is left."""
    token = f"protolink-ci-{secrets.token_hex(6)}"
    checkout = repository(tmp_path / "checkout", {"test_escape.py": ESCAPE})
    before = tree_state(checkout)

    process = runner.start(checkout, "--env", SECRET_VARIABLE, test=["python3", "test_escape.py", token, str(checkout)])
    try:
        printed = _running(process, "outcome: ")
        [job_dir] = runner.jobs.iterdir()  # while the job runs: its directory on the host is untouched
        assert sorted(os.listdir(job_dir)) == ["owner", "workspace"]
        assert (job_dir / "owner").read_text().startswith("process:")
        (job_dir / "workspace" / "repo" / "go").touch()
        stdout, stderr = process.communicate(timeout=JOB_GUARD)
    finally:
        process.kill()
    job = runner.finished(process.returncode, printed + stdout, stderr)

    assert (job.returncode, job.report["outcome"], job.report["exit_code"]) == (0, "passed", 0), job.stderr
    assert_secrets_absent(job)
    assert hashlib.sha256(SECRET.encode()).hexdigest() in job.stdout  # it reached the test
    assert "secret itself: ***" in job.stdout and "secret itself: ***" in job.command("test")["output_tail"]
    assert job.report["env"] == [SECRET_VARIABLE]
    outcome = json.loads(job.stdout.split("outcome: ", 1)[1].splitlines()[0])
    written = {target for target, result in outcome.items() if result == "written"}
    # gVisor makes the mount point's parents in the sandbox's own /tmp: writes there stay inside
    assert written == ({str(job_dir / "owner"), str(job_dir / token)} if GVISOR else set()), outcome
    assert outcome["exec /tmp"] == "EACCES", outcome
    for path in (Path(f"/{token}"), Path(f"/etc/{token}"), Path(f"/opt/protolink/{token}"), checkout / token):
        assert not path.exists()
    assert tree_state(checkout) == before
    assert_nothing_left(runner, job, docker_client)


# -- what the job leaves in its workspace ---------------------------------------------------------

PLANT = """\
import os, stat, sys
from pathlib import Path

MARKER = sys.argv[1]
hook = f"#!/bin/sh\\necho ran >> {MARKER}\\n"
for name in ("post-checkout", "pre-commit", "post-merge", "fsmonitor-watchman", "pre-auto-gc"):
    path = Path(".git/hooks") / name
    path.write_text(hook)
    path.chmod(0o755)
with open(".git/config", "a") as config:
    config.write(f"[core]\\n\\tfsmonitor = echo ran >> {MARKER}\\n\\thooksPath = .git/hooks\\n"
                 f"\\tsshCommand = echo ran >> {MARKER}\\n[filter \\"x\\"]\\n\\tsmudge = echo ran >> {MARKER}\\n")
Path(".gitattributes").write_text("* filter=x\\n")
Path("out").mkdir()
Path("out/suid.bin").write_bytes(b"setuid payload\\n")
os.chmod("out/suid.bin", 0o6755)
print("setuid mode:", oct(os.stat("out/suid.bin").st_mode))
os.symlink("/etc/shadow", "junit.xml")
os.symlink("/etc/shadow", "out/shadow.txt")
os.symlink("/etc", "out/etc")
os.mkfifo("out/fifo")
Path("reports").mkdir()
Path("reports/good.xml").write_text('<testsuite><testcase name="a"/><testcase name="b"><failure/></testcase>'
                                    '<testcase name="c"><skipped/></testcase></testsuite>')
Path("reports/not-xml.xml").write_text("this is not xml <<<")
xxe = '<?xml version="1.0"?><!DOCTYPE t [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
Path("reports/xxe-attribute.xml").write_text(xxe + '<testsuite><testcase name="&e;"/></testsuite>')
Path("reports/xxe-text.xml").write_text(xxe + '<testsuite><testcase name="a"><system-out>&e;</system-out>'
                                        '</testcase></testsuite>')
laughs = ['<!ENTITY l0 "lol">'] + [f'<!ENTITY l{i} "{("&l%d;" % (i - 1)) * 10}">' for i in range(1, 10)]
laughs = f'<?xml version="1.0"?><!DOCTYPE t [{"".join(laughs)}]>'
Path("reports/laughs-attribute.xml").write_text(laughs + '<testsuite><testcase name="&l9;"/></testsuite>')
Path("reports/laughs-text.xml").write_text(laughs + '<testsuite><testcase name="a"><system-out>&l9;</system-out>'
                                           '</testcase></testsuite>')
with open("reports/huge.xml", "w") as huge:
    huge.write("<testsuite>")
    for _ in range(33 * 1024):
        huge.write('<testcase name="x"/>' * 52)
    huge.write("</testsuite>")
"""


def test_ci_workspace_plants_act_on_nothing_and_outputs_are_checked(runner, docker_client, tmp_path):
    """The checkout holds a symlink to /etc/shadow and a FIFO. A test plants git hooks, core.fsmonitor,
    core.sshCommand and a smudge filter in the copy's .git (each would append to a marker file on
    the host), a setuid file, a symlink to /etc/shadow named junit.xml and another among the
    artifacts, a symlink to /etc and a FIFO; its JUnit files are one good, one not XML, two with an
    external entity to /etc/passwd (in an attribute, in text), two billion-laughs ones and one over
    32 MiB.

    The checkout's link is copied as a link and its FIFO left out, both reported. Nothing runs on
    the host (the marker never appears, git on the checkout runs none of it); the symlinks are
    reported as rejected and not followed, the FIFO is refused (gVisor keeps it inside), the setuid
    file comes out mode 0644 with its content only; the good JUnit file is counted and so is the
    external entity in text, left unresolved; the others are rejected (not XML, an external entity
    in an attribute, the amplification limit, the size cap); no /etc/passwd line anywhere."""
    marker = tmp_path / "marker"
    checkout = repository(tmp_path / "checkout", {"plant.py": PLANT, "README": "hostile\n"}, git=True)
    (checkout / "host-shadow").symlink_to("/etc/shadow")
    os.mkfifo(checkout / "pipe")
    before = tree_state(checkout)

    job = runner.run(checkout, "--junit", "junit.xml", "--junit", "reports/*.xml", "--artifacts", "out/**",
                     "--artifacts", "junit.xml", "--artifacts", "host-shadow",
                     test=["python3", "plant.py", str(marker)])

    assert (job.returncode, job.report["outcome"]) == (0, "passed"), job.stderr
    assert "setuid mode: 0o106755" in job.stdout  # the bits were set inside
    repository_copied = job.report["repository"]
    assert repository_copied["commit"] is None and repository_copied["symlinks"] == 1  # copied as a link
    assert repository_copied["left_out"] == [{"path": "pipe", "reason": "not a regular file (prw-r--r--)"}]
    rejected = {item["path"]: item["reason"] for item in job.report["junit"]["rejected"]}
    assert rejected["junit.xml"] == "a symbolic link (not followed)"
    assert rejected["reports/not-xml.xml"].startswith("not XML")
    assert rejected["reports/huge.xml"].endswith("bytes, more than the 33554432 allowed")
    assert rejected["reports/xxe-attribute.xml"].startswith("not XML: Attribute references external entity")
    for laughs in ("reports/laughs-attribute.xml", "reports/laughs-text.xml"):
        assert rejected[laughs].startswith("not XML: Maximum entity amplification factor exceeded")
    counted = {item["path"]: item for item in job.report["junit"]["files"]}
    assert counted["reports/good.xml"]["tests"] == 3 and counted["reports/good.xml"]["failures"] == 1
    assert counted["reports/xxe-text.xml"]["tests"] == 1  # parsed, the entity left unresolved
    assert set(counted) == {"reports/good.xml", "reports/xxe-text.xml"}
    assert len(rejected) == 6
    assert job.report["junit"]["totals"] == {"tests": 4, "passed": 2, "failures": 1, "errors": 0, "skipped": 1}
    assert "root:" not in job.report_text and "lollollol" not in job.report_text
    kept = {str(path.relative_to(runner.artifacts)): path for path in runner.artifacts.rglob("*")}
    for path in kept.values():
        assert not path.is_symlink()
        if path.is_file():
            assert b"root:" not in path.read_bytes()
    artifacts_rejected = {item["path"]: item["reason"] for item in job.report["artifacts"]["rejected"]}
    links = dict.fromkeys(("host-shadow", "junit.xml", "out/etc", "out/shadow.txt"), "a symbolic link (not followed)")
    # gVisor keeps a FIFO made in a bind mount inside the sandbox: the host has none to refuse
    fifo = {} if GVISOR else {"out/fifo": "not a regular file (prw-r--r--)"}
    assert artifacts_rejected == {**links, **fifo}
    suid = runner.artifacts / "artifacts" / "out" / "suid.bin"
    assert stat.S_IMODE(suid.stat().st_mode) == 0o644 and suid.read_bytes() == b"setuid payload\n"
    assert [item["path"] for item in job.report["artifacts"]["files"]] == ["out/suid.bin"]

    assert tree_state(checkout) == before
    _git(checkout, "status")  # git on the user's checkout runs nothing the job planted in its copy
    assert not marker.exists()
    assert_nothing_left(runner, job, docker_client)


# -- the network: the allow-list in setup, nothing in the test ------------------------------------

#: A plain-HTTP GET through the proxy the sandbox names; exit 3 on a refusal (the proxy's status
#: printed), 4 when no connection could be made, 5 without a proxy.
FETCH = """\
import http.client, os, sys, urllib.parse
if "HTTP_PROXY" not in os.environ:
    print("no proxy")
    sys.exit(5)
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
try:
    connection = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=20)
    connection.request("GET", sys.argv[1])
    answer = connection.getresponse()
except OSError as error:
    print("no connection:", error)
    sys.exit(4)
body = answer.read().decode()
print(answer.status, body)
sys.exit(0 if answer.status == 200 else 3)
"""


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
        body = f"hello from {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def loopback_server(handler: Callable[..., http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    """An HTTP server of ``handler`` on this host's loopback; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


#: Opens tunnels through the job's proxy to its argument (HOST:PORT) and exits holding them, as npm
#: does with the connections it keeps alive.
TUNNELS = """\
import os, socket, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
tunnels = [socket.create_connection((proxy.hostname, proxy.port), timeout=20) for _ in range(int(sys.argv[2]))]
for tunnel in tunnels:
    tunnel.sendall(f"CONNECT {sys.argv[1]} HTTP/1.1\\r\\nHost: {sys.argv[1]}\\r\\n\\r\\n".encode())
print(*sorted({tunnel.recv(1024).split(b"\\r\\n")[0].decode() for tunnel in tunnels}))
"""


def hello_server() -> contextlib.AbstractContextManager[int]:
    """A server that says hello on this host's loopback; its port."""
    return loopback_server(_Hello)


def test_ci_setup_reaches_only_its_allow_list_and_the_test_nothing(runner, docker_client, tmp_path):
    """A setup phase with one loopback server on its allow-list fetches from it, then tries a
    second server on another port, a name not on the list and a direct connection without the
    proxy, and leaves 16 tunnels to the allowed server open as it exits; the test phase fetches
    from the allowed server again, after the network was cut, and exits with the fetch's status.

    Setup reaches the allowed server only: the others are refused by the proxy (or find no
    network), and the report's egress decisions say so with the phase (allowed, then denied in
    setup, the tunnels' ends too; denied with "deny-all" in test). The test's refusal is its own
    exit code (3), passed through as the runner's, with the outcome failed; nothing is left."""
    with hello_server() as allowed, hello_server() as other:
        checkout = repository(tmp_path / "checkout", {"fetch.py": FETCH, "tunnels.py": TUNNELS, "direct.py": f"""\
            import socket
            try:
                socket.create_connection(("127.0.0.1", {allowed}), timeout=10)
                print("direct: connected")
            except OSError as error:
                print("direct: refused", error.errno)
            """})
        setup = [f"python3 fetch.py http://127.0.0.1:{allowed}/ > allowed.txt",
                 f"python3 fetch.py http://127.0.0.1:{other}/ > other.txt; echo $? >> other.txt",
                 "python3 fetch.py http://pypi.org/simple/ > name.txt; echo $? >> name.txt",
                 "python3 direct.py > direct.txt", f"python3 tunnels.py 127.0.0.1:{allowed} 16"]
        job = runner.run(checkout, f"--allow=127.0.0.1:{allowed}", *(f"--setup={command}" for command in setup),
                         test=["sh", "-c", f"cat allowed.txt other.txt name.txt direct.txt && "
                                           f"exec python3 fetch.py http://127.0.0.1:{allowed}/"], **LOOPBACK)

    assert (job.returncode, job.report["outcome"], job.report["exit_code"]) == (3, "failed", 3), job.stderr
    assert [command["exit_code"] for command in job.report["phases"][0]["commands"]] == [0, 0, 0, 0, 0]
    assert job.command("setup", 4)["output_tail"] == "HTTP/1.1 200 Connection established\n"
    assert f"200 hello from {allowed}" in job.stdout
    assert f"hello from {other}" not in job.stdout
    assert job.stdout.count("\n3\n") == 2, job.stdout  # the other port and the name: refused by the proxy
    assert "direct: refused" in job.stdout
    decisions = [(d["phase"], d["kind"], d["host"], d["port"]) for d in job.report["egress"]["decisions"]
                 if d["kind"] != "closed"]
    assert decisions == [("setup", "allowed", "127.0.0.1", allowed), ("setup", "denied", "127.0.0.1", other),
                         ("setup", "denied", "pypi.org", 80), *[("setup", "allowed", "127.0.0.1", allowed)] * 16,
                         ("test", "denied", "127.0.0.1", allowed)]
    test_denial = [d for d in job.report["egress"]["decisions"] if d["phase"] == "test"]
    assert [d["reason"] for d in test_denial] == ["deny-all"]
    assert job.report["egress"]["allow"] == [f"127.0.0.1:{allowed}"]
    assert [phase["network"] for phase in job.report["phases"]] == ["allow-list", "none"]
    assert_nothing_left(runner, job, docker_client)


# -- processes meant to outlive the job -----------------------------------------------------------

DAEMON = """\
import os, signal, sys, time
from pathlib import Path

LOOP = "import sys, time\\nwhile True:\\n    open(sys.argv[2], 'a').write('beat\\\\n')\\n    time.sleep(0.1)\\n"
marker, heartbeat = sys.argv[1], Path(sys.argv[2]).resolve()
others = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        command = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue
    if b"protolink-ci-daemon-" in command and b"\\0-c\\0" in command:
        others.append(command.decode(errors="replace"))
print("daemons already running:", others)
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if os.fork() == 0:
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.execv(sys.executable, [sys.executable, "-c", LOOP, marker, str(heartbeat)])
    os._exit(0)
os.wait()
deadline = time.monotonic() + 60
while not heartbeat.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("daemon started:", heartbeat.exists())
"""


def test_ci_daemons_do_not_outlive_their_command_or_the_job(runner, docker_client, tmp_path):
    """A setup command and the test each start a daemon meant to outlive the job (double fork,
    setsid, SIGHUP ignored, standard streams on /dev/null, a heartbeat file in the workspace)
    and return once its heartbeat is there.

    The setup's daemon is gone when the test starts (strays are killed after each command); the
    job passes, and afterwards no process of either daemon exists on the host, the container
    and the workspace are gone."""
    markers = [f"protolink-ci-daemon-{phase}-{secrets.token_hex(6)}" for phase in ("setup", "test")]
    checkout = repository(tmp_path / "checkout", {"daemon.py": DAEMON})

    job = runner.run(checkout, f"--setup=python3 daemon.py {markers[0]} setup.beat",
                     test=["python3", "daemon.py", markers[1], "test.beat"])

    assert (job.returncode, job.report["outcome"]) == (0, "passed"), job.stderr
    assert job.stdout.count("daemon started: True") == 2, job.stdout
    assert "daemons already running: []\n" in job.command("test")["output_tail"]
    assert_nothing_left(runner, job, docker_client, *markers)


# -- exhaustion: output, disk, tasks, time --------------------------------------------------------

class ResidentHighWater:
    """The highest resident memory a process reached (``VmHWM``), looked at until it ends."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.02):
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak = max(self.peak, int(line.split()[1]) * 1024)

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.peak


GIB_OUTPUT = """\
import sys
chunk = b"x" * ((1 << 20) - 1) + b"\\n"
written = 0
for _ in range(1024):
    written += sys.stdout.buffer.write(chunk)
sys.stdout.buffer.write(b"the end of the output\\n")
open("written.txt", "w").write(str(written))
"""


def test_ci_gib_of_output_is_cut_at_the_cap_and_the_runner_stays_small(runner, docker_client, tmp_path):
    """A test writes 1 GiB to its standard output.

    The job passes (the command is not stopped, what is past the cap is dropped); the report
    marks the command truncated with output_bytes exactly the 16 MiB cap and the last 8 KiB of
    what was kept as its tail; the runner's log carries those 16 MiB and no more, and the
    runner's peak resident memory stays far below the output's size (its own high-water mark, not
    that of the image build script it may run)."""
    checkout = repository(tmp_path / "checkout", {"output.py": GIB_OUTPUT})
    log = tmp_path / "stdout.log"
    with log.open("wb") as stdout:
        process = subprocess.Popen(runner.argv(checkout, "--artifacts", "written.txt", test=["python3", "output.py"]),
                                   stdout=stdout, stderr=subprocess.PIPE, env=runner.env(), stdin=subprocess.DEVNULL)
        high_water = ResidentHighWater(process.pid)
        stderr = process.stderr.read().decode()  # type: ignore[union-attr]
        returncode = process.wait()
        peak = high_water.stop()
    job = runner.finished(returncode, "", stderr)

    assert (job.returncode, job.report["outcome"]) == (0, "passed"), stderr
    command = job.command("test")
    assert command["truncated"] is True and command["output_bytes"] == 16 * MiB
    assert command["output_tail"] == "x" * (8 * 1024 - 1) + "\n"
    # the log shows a line longer than MAX_PENDING_LINE in pieces, a newline after each
    assert 16 * MiB <= log.stat().st_size <= 16 * MiB + 16 * MiB // MAX_PENDING_LINE
    assert (runner.artifacts / "artifacts" / "written.txt").read_text() == str(1 << 30)  # all of it was written
    figure("CI runner's peak RSS with 1 GiB of test output", f"{peak / MiB:.0f} MiB")
    assert peak < 256 * MiB
    assert_nothing_left(runner, job, docker_client)


DISK_FILL = """\
import itertools, os
chunk = os.urandom(1 << 20)
for number in itertools.count():  # a file after another, each until a write is refused
    with open(f"fill-{number}.bin", "wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as error:
            print("write refused:", error.strerror, flush=True)
"""


def test_ci_disk_fill_is_stopped_by_the_disk_budget_and_reported(runner, docker_client, tmp_path):
    """A test fills the workspace under a 32 MiB disk budget (--disk-mib 32), one file after
    another, each until a write is refused (the per-file limit), never ending by itself.

    The sandbox stops the command (SIGKILL, exit 137 passed through, outcome failed), the
    report's error says the workspace outgrew its disk budget and its disk use is past it;
    the workspace and the container are gone."""
    checkout = repository(tmp_path / "checkout", {"fill.py": DISK_FILL})

    job = runner.run(checkout, "--disk-mib", "32", test=["python3", "fill.py"])

    assert (job.returncode, job.report["outcome"], job.report["exit_code"]) == (137, "failed", 137), job.stderr
    assert job.command("test")["exit_code"] == -9
    assert job.report["error"].startswith("the workspace grew past its disk budget of 33554432 bytes"), job.report
    assert job.report["resources"]["disk_used_bytes"] > 32 * MiB
    assert_nothing_left(runner, job, docker_client)


FORK_BOMB = """\
import os, sys, time
refused = children = 0
while refused < 50:
    try:
        pid = os.fork()
    except BlockingIOError:
        refused += 1
        continue
    if pid == 0:
        os.setsid()
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
    children += 1
print(f"fork refused {refused} times after {children} children", flush=True)
"""


def test_ci_fork_bomb_meets_the_pids_limit_and_the_next_job_runs(runner, docker_client, tmp_path):
    """A test starts a fork bomb whose children each lead a session of their own and fork
    forever, under a limit of 96 tasks (--pids 96); the test itself returns once fork has been
    refused 50 times.

    Fork is refused at the limit (the report's peak tasks is at most 96), the job passes with
    the test's exit status (under gVisor the bomb may end the sandbox instead: the job then ends
    as an error, exit 125), the bomb's processes are gone with the job, and the next job on the
    same engine runs normally; nothing is left."""
    marker = f"protolink-ci-bomb-{secrets.token_hex(6)}"
    checkout = repository(tmp_path / "checkout", {"bomb.py": FORK_BOMB})

    job = runner.run(checkout, "--pids", "96", test=["python3", "bomb.py", marker])

    if GVISOR and job.report["outcome"] == "error":  # the bomb may end gVisor's sandbox (SECURITY.md)
        assert job.returncode == 125 and job.report["error"].startswith("SandboxUnavailableError: "), job.stderr
        figure("CI fork bomb (gVisor)", f"the sandbox ended: {job.report['error']}")
    else:
        assert (job.returncode, job.report["outcome"]) == (0, "passed"), job.stderr
        assert "fork refused 50 times" in job.stdout
        assert job.report["resources"]["pids_peak"] <= 96
    assert_nothing_left(runner, job, docker_client, marker)
    after = runner.run(checkout, test=["echo", "next job"])
    assert (after.returncode, after.report["outcome"], after.stdout) == (0, "passed", "next job\n"), after.stderr
    assert_nothing_left(runner, after, docker_client)


def test_ci_timeout_ends_the_job_with_124_and_leaves_nothing(runner, docker_client, tmp_path):
    """A test sleeps for an hour under a 25-second job timeout (--timeout 25).

    The runner exits 124 with the outcome timed_out, the error naming the limit, the test
    command marked timed out; its container and its workspace are gone."""
    marker = f"protolink-ci-sleep-{secrets.token_hex(6)}"
    checkout = repository(tmp_path / "checkout", {"README": "sleeps\n"})

    job = runner.run(checkout, "--timeout", "25", test=["sh", "-c", SLEEP, marker])

    assert (job.returncode, job.report["outcome"]) == (EXIT_TIMED_OUT, "timed_out"), job.stderr
    assert job.report["error"] == "the job took longer than 25 s"
    assert job.command("test")["timed_out"] is True and job.command("test")["exit_code"] is None
    assert_nothing_left(runner, job, docker_client, marker)


# -- the runner stopped -----------------------------------------------------------------------------

def _running(process: subprocess.Popen[str], marker: str) -> str:
    """Wait until the job's test command printed ``marker`` (the runner streams its output);
    the output until then."""
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if marker in line:
            return "".join(lines)
    _, stderr = process.communicate(timeout=JOB_GUARD)
    raise AssertionError(f"the runner ended ({process.returncode}) before its test ran: {stderr}")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, EXIT_TERMINATED), (signal.SIGINT, EXIT_INTERRUPTED)])
def test_ci_runner_stopped_by_a_signal_reports_and_removes_everything(runner, docker_client, tmp_path, signum, code):
    """The runner gets SIGTERM (a CI system cancelling the job), or SIGINT (Ctrl-C), while the
    test command runs.

    It exits 143 (SIGTERM) or 130 (SIGINT) after writing its report with the outcome
    interrupted, and removes the container and the workspace first; the test command's
    processes are gone."""
    marker = f"protolink-ci-running-{secrets.token_hex(6)}"
    checkout = repository(tmp_path / "checkout", {"README": "runs until stopped\n"})
    process = runner.start(checkout, test=["sh", "-c", SLEEP, marker])
    try:
        _running(process, marker)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=JOB_GUARD)
    finally:
        process.kill()
    job = runner.finished(process.returncode, stdout, stderr)

    assert (job.returncode, job.report["outcome"], job.report["exit_code"]) == (code, "interrupted", code), stderr
    assert "Traceback" not in stderr
    assert_nothing_left(runner, job, docker_client, marker)


def test_ci_runner_killed_outright_is_cleaned_up_by_the_next_runner(runner, docker_client, tmp_path):
    """The runner is killed with SIGKILL while the test command runs: it removes nothing and
    writes no report.

    Its job directory and its container stay only until the next runner starts: that one
    sweeps the directory (its owner is gone) and the reaper removes the container, and the
    next job passes; the killed job's processes are gone."""
    marker = f"protolink-ci-killed-{secrets.token_hex(6)}"
    name = f"{TEST_NAME_PREFIX}ci-killed-{secrets.token_hex(4)}"
    checkout = repository(tmp_path / "checkout", {"README": "runs until killed\n"})
    process = runner.start(checkout, "--name", name, test=["sh", "-c", SLEEP, marker])
    try:
        _running(process, marker)
    finally:
        process.kill()
        process.communicate(timeout=JOB_GUARD)
    assert not runner.report.exists()
    assert len(list(runner.jobs.iterdir())) == 1
    assert docker_client.containers.list(all=True, filters={"name": name}) != []

    after = runner.run(checkout, test=["echo", "next job"])

    assert (after.returncode, after.report["outcome"]) == (0, "passed"), after.stderr
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    assert_nothing_left(runner, after, docker_client, marker)


# -- a git URL ---------------------------------------------------------------------------------------

class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def dumb_http(directory: Path) -> contextlib.AbstractContextManager[int]:
    """``directory`` served over HTTP on this host's loopback (git's dumb protocol); its port."""
    return loopback_server(lambda *a: _Files(*a, directory=str(directory)))


def bare(source: Path, target: Path) -> Path:
    """A bare clone of ``source`` at ``target``, ready for the dumb protocol."""
    _git(source.parent, "clone", "--quiet", "--bare", str(source), str(target))
    _git(target, "update-server-info")
    return target


LOOK = """\
import os
from pathlib import Path
print("submodule files:", sorted(os.listdir("sub")) if os.path.isdir("sub") else None)
print("hooks:", sorted(os.listdir(".git/hooks")) if os.path.isdir(".git/hooks") else None)
print("fsmonitor in config:", "fsmonitor" in Path(".git/config").read_text())
"""


def test_ci_git_url_is_cloned_without_submodules_hooks_or_credentials(runner, docker_client, tmp_path):
    """The repository is a git URL with credentials in it (http://user:token@...), served on
    loopback; its tree names a submodule whose URL is a private repository on the host's disk,
    and a second repository's tree holds a .GIT/hooks/post-checkout (a path git refuses to
    check out), both cloned by the runner on the host.

    The first is cloned without its submodule (nothing of the private repository reaches the
    job), with no hook and no fsmonitor in the copy; its commit is in the report, whose source,
    like the output, shows the URL without the token. The second's clone fails on the invalid
    path (exit 121, repository_error, the token absent); the marker the hook would
    write never appears and nothing is left."""
    token = f"tok{secrets.token_hex(8)}"
    marker = tmp_path / "marker"
    private = repository(tmp_path / "private", {"secret.txt": f"{CANARY}\n"}, git=True)
    source = repository(tmp_path / "source", {"look.py": LOOK, ".gitmodules": textwrap.dedent(f"""\
        [submodule "sub"]
        \tpath = sub
        \turl = {private}
        """)}, git=True)
    _git(source, "update-index", "--add", "--cacheinfo", f"160000,{_git(private, 'rev-parse', 'HEAD').strip()},sub")
    _git(source, "commit", "--quiet", "--message", "a submodule")
    served = tmp_path / "served"
    bare(source, served / "good.git")

    hostile = repository(tmp_path / "hostile", {"README": "hostile\n"}, git=True)
    hook = _git(hostile, "hash-object", "-w", "--stdin", input_text=f"#!/bin/sh\necho ran >> {marker}\n").strip()
    hooks = _git(hostile, "mktree", input_text=f"100755 blob {hook}\tpost-checkout\n").strip()
    dot_git = _git(hostile, "mktree", input_text=f"040000 tree {hooks}\thooks\n").strip()
    readme = _git(hostile, "rev-parse", "HEAD:README").strip()
    tree = _git(hostile, "mktree", input_text=f"040000 tree {dot_git}\t.GIT\n100644 blob {readme}\tREADME\n").strip()
    commit = _git(hostile, "commit-tree", tree, "-p", "HEAD", "-m", "plant a hook").strip()
    _git(hostile, "update-ref", "refs/heads/main", commit)
    bare(hostile, served / "hostile.git")

    with dumb_http(served) as port:
        good = runner.run(f"http://user:{token}@127.0.0.1:{port}/good.git", test=["python3", "look.py"])
        good_report = runner.report.read_text()
        refused = runner.run(f"http://user:{token}@127.0.0.1:{port}/hostile.git", test=["true"])

    assert (good.returncode, good.report["outcome"]) == (0, "passed"), good.stderr
    assert "submodule files: []" in good.stdout, good.stdout  # the gitlink's directory, empty
    assert "hooks: None" in good.stdout and "fsmonitor in config: False" in good.stdout
    assert good.report["repository"]["commit"] == _git(source, "rev-parse", "HEAD").strip()
    assert good.report["repository"]["source"] == f"http://***@127.0.0.1:{port}/good.git"
    assert CANARY not in good.stdout and CANARY not in good_report
    for text in (good.stdout, good.stderr, good_report, refused.stdout, refused.stderr, refused.report_text):
        assert token not in text
    assert (refused.returncode, refused.report["outcome"]) == (EXIT_REPOSITORY, "repository_error"), refused.stderr
    assert "invalid path '.GIT/hooks/post-checkout'" in refused.report["error"], refused.report["error"]
    assert refused.report["container"] is None and list(runner.jobs.iterdir()) == []
    assert not marker.exists()
    assert_nothing_left(runner, good, docker_client)
