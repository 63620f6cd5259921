"""Egress through an appliance's host-side proxy against the host's own network, side by side.

Needs a Docker Engine and the sandbox image (built when missing), and the package index that
pip is configured for::

    python bench/egress.py [--size-mb 200] [--runs 3] [--connections 200] [--pip-runs 3]
                           [--image IMAGE] [--baseline CHECKOUT --baseline-image IMAGE]

It starts an appliance of its own (``protolink-sandbox up --allow ...`` over a temporary
workspace, with the test-only ``PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK=1`` so that its proxy may
reach this host's loopback server) and removes it at the end. In one run, the sandbox's case and
the host's take turns:

- a download of ``--size-mb`` MB from a loopback HTTP server, by a command in the sandbox through
  the proxy (``CONNECT``, as any HTTPS client does) against the same client on the host directly:
  target >= 0.8x the direct throughput; with the CPU seconds per GB each party spent on it (the
  client, the server, and the appliance's egress daemon, which relays it);
- connect + first byte of a 1-byte answer, median of ``--connections``: the proxy's added
  latency, target <= 2 ms;
- ``pip install`` of a mid-sized package set (20 distributions with their dependencies) into a
  fresh venv, in the sandbox against the host, from the same index (pip's configured
  ``index-url``, else PyPI's default; the index's certificate authority from pip's ``cert``
  setting, copied into the workspace and passed to the sandbox's pip with ``--cert``, as a user
  would): target <= 1.3x the host's wall time.

With ``--baseline``, a second appliance runs another checkout's code (its host side through
``PYTHONPATH``, its container from ``--baseline-image``, that checkout's image) and takes its
turn beside the others in the download and latency cases: a before-and-after in one run.

The same client code (this file, standard library only) runs on both sides; it times itself, so
``protolink-sandbox exec``'s own start is not counted. The sandbox runs its commands pinned to the
appliance's cpuset at nice 19, in the container's CPU cgroup (which weighs as one nice-0 process
against the host's others, nice 19 ranking the command only below the container's own
processes). So the host's client is timed twice: as the host runs it (unpinned, nice 0, in the
bench's cgroup) and under the sandbox's CPU policy (``like``: the appliance's cpuset, nice 19, in
a CPU cgroup of its own of the default weight, made for the run where the bench may, as root;
a baseline on other CPUs gets a case of its own). Each row prints both ratios side by side: ``vs
host`` (everything the sandbox costs, its CPU policy included) and ``vs like`` (what the proxy
costs: the same client under the same policy, directly). The targets are judged on both;
README's target rows quote ``vs like`` and give ``vs host`` beside it.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import resource
import shutil
import socket
import socketserver
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

THROUGHPUT_TARGET = 0.8
LATENCY_TARGET_MS = 2.0
PIP_TARGET = 1.3
PACKAGES = ["requests", "rich", "httpx", "jinja2", "pyyaml", "attrs", "click"]
#: The cases' labels: the command in the sandbox through its proxy, the host's client as it runs,
#: and the baseline's sandbox; ``like`` cases are named by :func:`like`.
SANDBOX, HOST, BASELINE = "sandbox", "host", "baseline"
#: How the table names the proxied cases.
_WHO = {SANDBOX: "this", BASELINE: "baseline"}
CHUNK = 1 << 20
NOBODY = 65534
#: The nice level the sandbox runs commands at.
COMMAND_NICE = 19
#: Connections timed one after another in one command: within the proxy's default rate limit
#: (50 a second, a bucket of 50), which the pause between commands refills.
BATCH = 25


# The client: runs on the host and in the sandbox (python3 egress.py client ...).

def _open(host: str, port: int, proxy: str | None, marks: list[float]) -> socket.socket:
    """A connection to ``host:port``, directly or through an HTTP proxy's CONNECT tunnel; the
    time is appended to ``marks`` once connected and once the tunnel is open."""
    if proxy is None:
        sock = socket.create_connection((host, port))
        marks += [time.perf_counter()] * 2
        return sock
    where = urlsplit(proxy)
    sock = socket.create_connection((where.hostname, where.port))
    marks.append(time.perf_counter())
    sock.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(4096)
        if not data:
            raise ConnectionError(f"the proxy closed the tunnel to {host}:{port}: {head!r}")
        head += data
    if head.split(b" ", 2)[1] != b"200":
        raise ConnectionError(f"the proxy refused {host}:{port}: {head.splitlines()[0].decode()}")
    marks.append(time.perf_counter())
    return sock


def _get(host: str, port: int, size: int, proxy: str | None) -> tuple[list[float], float, int]:
    """GET ``size`` bytes: (seconds to connected, to the tunnel open, to the first byte; seconds
    to the last; bytes of body)."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    started = time.perf_counter()
    marks: list[float] = []
    with _open(host, port, proxy, marks) as sock:
        sock.sendall(f"GET /bytes/{size} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        received = sock.recv_into(buffer)
        marks.append(time.perf_counter())
        head_end = bytes(view[:received]).find(b"\r\n\r\n") + 4
        total = received - head_end
        while (got := sock.recv_into(buffer)) > 0:
            total += got
    return [mark - started for mark in marks], time.perf_counter() - started, total


def _cpu_seconds() -> float:
    """CPU seconds (user and system) this process has spent."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def client(argv: list[str]) -> None:
    """``download HOST PORT SIZE`` | ``latency HOST PORT COUNT`` | ``timed -- ARGV``; prints JSON.
    ``--proxy`` (first): through the proxy that ``HTTPS_PROXY`` names."""
    proxy = os.environ["HTTPS_PROXY"] if argv[:1] == ["--proxy"] else None
    argv = argv[1:] if proxy else argv
    if argv[0] == "download":
        before = _cpu_seconds()
        _, seconds, size = _get(argv[1], int(argv[2]), int(argv[3]), proxy)
        print(json.dumps({"seconds": seconds, "bytes": size, "cpu": _cpu_seconds() - before}))
    elif argv[0] == "latency":
        marks = [_get(argv[1], int(argv[2]), 1, proxy)[0] for _ in range(int(argv[3]))]
        print(json.dumps({"marks": marks}))
    else:
        started = time.perf_counter()
        done = subprocess.run(argv[2:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        print(json.dumps({"seconds": time.perf_counter() - started, "code": done.returncode,
                          "stderr": done.stderr.decode(errors="replace")[-2000:]}))


# The loopback server (python3 egress.py serve): GET /bytes/N answers N bytes.

class _Bytes(socketserver.BaseRequestHandler):
    block = b"x" * CHUNK

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = self.request.recv(4096)
            if not data:
                return
            head += data
        size = int(head.split(b" ", 2)[1].rsplit(b"/", 1)[1])
        self.request.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n".encode())
        view = memoryview(self.block)
        while size > 0:
            self.request.sendall(view[:min(size, CHUNK)])
            size -= CHUNK


def serve() -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Bytes)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


# The host side.

CLI = str(Path(sys.executable).with_name("protolink-sandbox"))


def run(argv: list[str], **env: str) -> str:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env={**os.environ, **env})
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user and system, every thread) process ``pid`` has spent."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def daemon_pid(name: str, **env: str) -> int:
    """The process id of appliance ``name``'s egress daemon."""
    found = re.search(r"daemon pid (\d+)", run([CLI, "egress", "--name", name], **env))
    if found is None:
        sys.exit(f"no egress daemon found for {name}")
    return int(found[1])


def cpuset(name: str) -> str:
    """The CPUs appliance ``name``'s container may run on (its cpuset), or "any"."""
    container = run(["docker", "ps", "-q", "--filter", f"label=io.protolink.appliance={name}"]).split()
    found = run(["docker", "inspect", "-f", "{{.HostConfig.CpusetCpus}}", *container[:1]]).strip() if container else ""
    return found or "any"


def cpu_numbers(cpus: str) -> set[int] | None:
    """The CPUs a cpuset text (``"1"``, ``"0,2-3"``) names; None for "any"."""
    if cpus == "any":
        return None
    numbers: set[int] = set()
    for part in cpus.split(","):
        first, _, last = part.partition("-")
        numbers.update(range(int(first), int(last or first) + 1))
    return numbers


class LikeCgroup:
    """A CPU cgroup of the default weight for the host's client ``like`` the sandbox (cgroup v1's
    ``cpu`` hierarchy or v2's unified one), removed by :meth:`remove`; :attr:`path` is None where
    the bench cannot make one (not root), and the client then stays in the bench's cgroup."""

    def __init__(self) -> None:
        self.path: Path | None = None
        for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")):
            if (root / "cgroup.procs").exists() and ((root / "cpu.shares").exists()
                                                     or "cpu" in _read(root / "cgroup.subtree_control").split()):
                try:
                    (path := root / f"protolink-bench-like-{uuid.uuid4().hex[:8]}").mkdir()
                except OSError:
                    return
                self.path = path
                return

    def join(self) -> None:
        """Move the calling process into the cgroup (a child before it runs the client)."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text("0")

    def remove(self) -> None:
        if self.path is not None:
            self.path.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def like(cpus: str) -> str:
    """The label of the host's client under a sandbox's CPU policy: cpuset ``cpus``, nice 19, a
    cgroup of its own."""
    return f"like (CPU {cpus})"


def pip_setting(key: str) -> str | None:
    """``key`` as pip's configuration has it (its environment variables first), or None."""
    found: dict[str, str] = {}
    for line in run([sys.executable, "-m", "pip", "config", "list"]).splitlines():
        name, _, value = line.partition("=")
        scope, _, setting = name.partition(".")
        if setting == key and (scope == ":env:" or ":env:" not in found):
            found[":env:" if scope == ":env:" else "file"] = ast.literal_eval(value)
    return found.get(":env:") or found.get("file")


def index_hosts(index: str, cert: str | None, package: str) -> list[str]:
    """``HOST:PORT`` of the index and of the hosts its page for ``package`` links files on."""
    context = ssl.create_default_context(cafile=cert)
    page = f"{index.rstrip('/')}/{package}/"
    with urllib.request.urlopen(page, context=context, timeout=60) as answer:
        text = answer.read().decode()
    hosts = set()
    for url in [page, *(urljoin(page, href) for href in re.findall(r'href="([^"]+)"', text))]:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https"):
            hosts.add(f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}")
    return sorted(hosts)


class Bench:
    """One appliance with egress (and, with a baseline, another), a loopback server, and the
    cases in turns."""

    def __init__(self, name: str, workspace: Path, port: int, script: Path, baseline: Path | None,
                 server_pid: int) -> None:
        self.name, self.workspace, self.port, self.script = name, workspace, port, script
        self.baseline = baseline
        self.server_pid = server_pid
        #: Each appliance's cpuset, by case (SANDBOX, and BASELINE with a baseline).
        self.cpusets = {SANDBOX: cpuset(name), **({BASELINE: cpuset(f"{name}-base")} if baseline else {})}
        self.cgroup = LikeCgroup()
        #: CPU seconds per GB of the downloads, by case: the client's, the server's, the daemon's.
        self.cpu_per_gb: dict[str, list[float | None]] = {}

    def inside(self, *argv: str, baseline: bool = False) -> dict:
        name, env = (f"{self.name}-base", {"PYTHONPATH": str(self.baseline)}) if baseline else (self.name, {})
        out = run([CLI, "exec", "--name", name, "--timeout", "900", "--cwd", str(self.workspace), "--",
                   "python3", str(self.script), "client", *argv], **env)
        return json.loads(out)

    def outside(self, *argv: str, cpus: str | None = None) -> dict:
        """The client on the host: as the host runs it, or with ``cpus`` under the sandbox's CPU
        policy (in :attr:`cgroup`, pinned to that cpuset, at the commands' nice level)."""
        numbers = None if cpus is None else cpu_numbers(cpus)

        def policy() -> None:
            self.cgroup.join()
            if numbers is not None:
                os.sched_setaffinity(0, numbers)
            os.nice(COMMAND_NICE)

        argv = [sys.executable, __file__, "client", *argv]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              preexec_fn=None if cpus is None else policy)
        if done.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
        return json.loads(done.stdout)

    def cases(self) -> dict[str, Any]:
        """Each case's client, by label: the sandbox's through its proxy, the host's as it runs,
        the host's like each appliance's CPU policy, and the baseline's sandbox's through its
        proxy when there is one. One label a distinct cpuset: appliances on the same CPUs share
        their ``like`` case."""
        cases: dict[str, Any] = {SANDBOX: lambda *argv: self.inside("--proxy", *argv),
                                 HOST: lambda *argv: self.outside(*argv)}
        for cpus in dict.fromkeys(self.cpusets.values()):
            cases[like(cpus)] = lambda *argv, cpus=cpus: self.outside(*argv, cpus=cpus)
        if self.baseline is not None:
            cases[BASELINE] = lambda *argv: self.inside("--proxy", *argv, baseline=True)
        return cases

    def download(self, size: int, runs: int) -> dict[str, float]:
        """Median seconds of a ``size``-byte download, by case (:meth:`cases`); each party's CPU
        in :attr:`cpu_per_gb`."""
        daemons = {SANDBOX: daemon_pid(self.name)}
        if self.baseline is not None:
            daemons[BASELINE] = daemon_pid(f"{self.name}-base", PYTHONPATH=str(self.baseline))
        spent: dict[str, list[float]] = {}
        seconds = self._in_turns(runs, "download", "127.0.0.1", str(self.port), str(size),
                                 value=lambda answer: answer["seconds"],
                                 spent=(spent, lambda case: [self.server_pid, daemons.get(case)]))
        gigabytes = runs * size / 1e9
        self.cpu_per_gb = {case: [total / gigabytes if party < 2 or case in daemons else None
                                  for party, total in enumerate(totals)] for case, totals in spent.items()}
        return seconds

    def latency(self, count: int) -> dict[str, list[float]]:
        """Median seconds to connected, to the tunnel open and to the first byte (each median
        apart), by case, in turns of :data:`BATCH` connections."""
        return self._in_turns(max(1, count // BATCH), "latency", "127.0.0.1", str(self.port), str(BATCH),
                              value=lambda answer: answer["marks"])

    def _in_turns(self, turns: int, *argv: str, value: Any,
                  spent: tuple[dict[str, list[float]], Any] | None = None) -> dict[str, Any]:
        """The client's median for ``argv`` by case (:meth:`cases`), taking turns. With ``spent``
        (totals by case, and ``watched(case)``: process ids or None), each turn adds the client's
        CPU seconds, then those of the processes watched, to its case's totals."""
        found: dict[str, list[Any]] = {}
        for _ in range(turns):
            for case, measure in self.cases().items():
                pids = spent[1](case) if spent else []
                before = [cpu_seconds(pid) if pid else 0.0 for pid in pids]
                answer = measure(*argv)
                if spent:
                    totals = spent[0].setdefault(case, [0.0] * 3)
                    totals[0] += answer["cpu"]
                    for place, (pid, seconds) in enumerate(zip(pids, before, strict=True), 1):
                        totals[place] += cpu_seconds(pid) - seconds if pid else 0.0
                if "bytes" in answer:
                    assert answer["bytes"] == int(argv[-1]), answer
                got = value(answer)
                found.setdefault(case, []).extend(got if isinstance(got, list) else [got])
        return {case: _median(values) for case, values in found.items()}

    def pip(self, index: str, cert: str | None, runs: int) -> tuple[dict[str, float], str]:
        """Median seconds of ``pip install`` into a fresh venv, by case: in the sandbox, on the
        host, and on the host like the sandbox; and pip's versions."""
        options = ["install", "--isolated", "--no-cache-dir", "--index-url", index]
        sandbox_cert = []
        if cert:
            shutil.copy(cert, self.workspace / "index-ca.pem")
            os.chmod(self.workspace / "index-ca.pem", 0o644)
            sandbox_cert = ["--cert", str(self.workspace / "index-ca.pem")]
        cpus = self.cpusets[SANDBOX]
        times: dict[str, list[float]] = {SANDBOX: [], HOST: [], like(cpus): []}
        versions = ""
        for number in range(runs):
            venv = self.workspace / f"venv-{number}"
            run([CLI, "exec", "--name", self.name, "--timeout", "300", "--", "python3", "-m", "venv", str(venv)])
            answer = self.inside("timed", "--", f"{venv}/bin/python", "-m", "pip", *options, *sandbox_cert, *PACKAGES)
            times[SANDBOX].append(_installed(answer, "in the sandbox"))
            for case, policy in ((HOST, None), (like(cpus), cpus)):
                with tempfile.TemporaryDirectory(prefix="protolink-bench-venv-") as host_venv:
                    run([sys.executable, "-m", "venv", host_venv])
                    answer = self.outside("timed", "--", f"{host_venv}/bin/python", "-m", "pip", *options,
                                          *(["--cert", cert] if cert else []), *PACKAGES, cpus=policy)
                    times[case].append(_installed(answer, "on the host"))
                    host_pip = run([f"{host_venv}/bin/python", "-m", "pip", "--version"]).split(" from")[0]
            sandbox_pip = run([CLI, "exec", "--name", self.name, "--", f"{venv}/bin/python", "-m", "pip",
                               "--version"]).split(" from")[0]
            versions = f"sandbox {sandbox_pip}, host {host_pip}"
        return {case: statistics.median(found) for case, found in times.items()}, versions


def _median(found: list[Any]) -> Any:
    """The median of numbers, or of each place of lists of numbers."""
    if found and isinstance(found[0], list):
        return [statistics.median(values) for values in zip(*found, strict=True)]
    return statistics.median(found)


def _installed(answer: dict, where: str) -> float:
    if answer["code"] != 0:
        sys.exit(f"pip install {where} failed:\n{answer['stderr']}")
    return float(answer["seconds"])


def row(what: str, who: str, figures: tuple[str, str, str], ratios: tuple[str, str], met: tuple[bool, bool],
        target: str) -> None:
    """One line of the table: a proxied case against the host's client and the host's client like
    the sandbox, both ratios, and whether each meets the target."""
    verdict = ", ".join(f"{against} {'met' if ok else 'NOT met'}" for against, ok in zip(("host", "like"), met,
                                                                                          strict=True))
    print(f"{what:<36}{who:<10}" + "".join(f"{figure:>12}" for figure in figures)
          + "".join(f"{ratio:>10}" for ratio in ratios) + f"  {target:<10}{verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3, help="downloads on each side")
    parser.add_argument("--connections", type=int, default=200, help="connections timed on each side")
    parser.add_argument("--pip-runs", type=int, default=3, help="pip installs on each side (0: none)")
    parser.add_argument("--cpus", default="1", help="the appliance's CPUs (`up --cpus`; default 1, as `up`'s)")
    parser.add_argument("--image", help="the appliance's image (default: `up`'s)")
    parser.add_argument("--baseline", type=Path, help="a checkout whose code runs a second appliance, in turns")
    parser.add_argument("--baseline-image", help="the image built from --baseline's checkout")
    args = parser.parse_args()
    if (args.baseline is None) != (args.baseline_image is None):
        parser.error("--baseline and --baseline-image go together")
    index = pip_setting("index-url") or "https://pypi.org/simple"
    cert = pip_setting("cert")
    allow = index_hosts(index, cert, PACKAGES[0]) if args.pip_runs else []
    server = subprocess.Popen([sys.executable, __file__, "serve"], stdout=subprocess.PIPE, text=True)
    name = f"protolink-bench-egress-{uuid.uuid4().hex[:8]}"
    try:
        port = int(server.stdout.readline())
        with tempfile.TemporaryDirectory(prefix="protolink-bench-egress-") as root:
            workspace = Path(root)
            script = workspace / "egress.py"
            shutil.copy(__file__, script)
            workspace.chmod(0o755)
            if os.geteuid() == 0:
                os.chown(workspace, NOBODY, NOBODY)
            rules = [f"--allow=127.0.0.1/32:{port}", *(f"--allow={rule}" for rule in allow)]
            appliances = [(name, args.image, {})]
            if args.baseline is not None:
                appliances.append((f"{name}-base", args.baseline_image, {"PYTHONPATH": str(args.baseline.resolve())}))
            started = []
            try:
                for appliance, image, env in appliances:
                    run([CLI, "up", "--name", appliance, "--root", f"{workspace}:rw", "--cpus", args.cpus,
                         *(["--image", image] if image else []), *rules], PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK="1", **env)
                    started.append((appliance, env))
                bench = Bench(name, workspace, port, script, args.baseline, server.pid)
                try:
                    measure(bench, args, index, cert, allow)
                finally:
                    bench.cgroup.remove()
            finally:
                for appliance, env in started:
                    run([CLI, "down", "--name", appliance], **env)
    finally:
        server.kill()


def measure(bench: Bench, args: argparse.Namespace, index: str, cert: str | None, allow: list[str]) -> None:
    load = os.getloadavg()
    proxied = [SANDBOX, *([BASELINE] if args.baseline else [])]
    print(f"appliances: {bench.name} (this code), " + (f"{bench.name}-base (the baseline's), " if args.baseline else "")
          + f"{args.cpus} CPU each, on CPUs " + ", ".join(f"{case} {bench.cpusets[case]}" for case in proxied)
          + f"; allowed: {', '.join([f'127.0.0.1/32:{bench.port} (loopback server)', *allow])}; "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("host: the host's client as the host runs it (unpinned, nice 0); like: the same client under the "
          f"sandbox's CPU policy (its cpuset, nice {COMMAND_NICE}, "
          + (f"cgroup {bench.cgroup.path}" if bench.cgroup.path else "the bench's own cgroup: none could be made")
          + ").\nvs like is the proxy's cost (README's "
          "target rows quote it); vs host adds the sandbox's CPU policy.")
    print(f"{'':<46}{'proxied':>12}{'host':>12}{'like':>12}{'vs host':>10}{'vs like':>10}  target")
    size = args.size_mb * 1_000_000
    seconds = bench.download(size, args.runs)
    for case in proxied:
        host, alike = seconds[HOST], seconds[like(bench.cpusets[case])]
        ratios = (host / seconds[case], alike / seconds[case])
        row(f"{args.size_mb} MB download, median of {args.runs}", _WHO[case],
            tuple(f"{size / taken / 1e6:.0f} MB/s" for taken in (seconds[case], host, alike)),
            tuple(f"{ratio:.2f}x" for ratio in ratios), tuple(ratio >= THROUGHPUT_TARGET for ratio in ratios),
            f">= {THROUGHPUT_TARGET}x")

    def parties(case: list[float | None]) -> str:
        return "/".join("-" if spent is None else f"{spent:.2f}" for spent in case)

    print("  CPU s per GB, client/server/daemon: "
          + ", ".join(f"{_WHO.get(case, case)} {parties(spent)}" for case, spent in bench.cpu_per_gb.items()))
    marks = bench.latency(args.connections)
    for case in proxied:
        first_byte = [marks[label][-1] for label in (case, HOST, like(bench.cpusets[case]))]
        added = [first_byte[0] - direct for direct in first_byte[1:]]
        row(f"connect + first byte, median of {args.connections}", _WHO[case],
            tuple(f"{taken * 1e3:.2f} ms" for taken in first_byte), tuple(f"{more * 1e3:+.2f} ms" for more in added),
            tuple(more * 1e3 <= LATENCY_TARGET_MS for more in added), f"<= {LATENCY_TARGET_MS:g} ms")
    labels = ("connected", "CONNECT answered", "first byte")
    for case in proxied:
        print(f"  {_WHO[case]}, medians from the start: "
              + ", ".join(f"{label} {mark * 1e3:.2f} ms" for label, mark in zip(labels, marks[case], strict=True)))
    if args.pip_runs:
        times, versions = bench.pip(index, cert, args.pip_runs)
        host, alike = times[HOST], times[like(bench.cpusets[SANDBOX])]
        ratios = (times[SANDBOX] / host, times[SANDBOX] / alike)
        row(f"pip install ({len(PACKAGES)} + deps), median of {args.pip_runs}", _WHO[SANDBOX],
            tuple(f"{taken:.1f} s" for taken in (times[SANDBOX], host, alike)),
            tuple(f"{ratio:.2f}x" for ratio in ratios), tuple(ratio <= PIP_TARGET for ratio in ratios),
            f"<= {PIP_TARGET}x")
        print(f"index {index} ({versions})")
    load = os.getloadavg()
    print(f"load at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client(sys.argv[2:])
    elif sys.argv[1:2] == ["serve"]:
        serve()
    else:
        main()
