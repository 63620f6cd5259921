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
``protolink-sandbox exec``'s own start is not counted. The sandbox runs its commands at nice 19,
so the host's client is also timed at nice 19 (a column of its own); the ratios and targets
compare with the host's client at its usual level.
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
        #: CPU seconds per GB of the downloads, by case: the client's, the server's, the daemon's.
        self.cpu_per_gb: list[list[float | None]] = []

    def inside(self, *argv: str, baseline: bool = False) -> dict:
        name, env = (f"{self.name}-base", {"PYTHONPATH": str(self.baseline)}) if baseline else (self.name, {})
        out = run([CLI, "exec", "--name", name, "--timeout", "900", "--cwd", str(self.workspace), "--",
                   "python3", str(self.script), "client", *argv], **env)
        return json.loads(out)

    def outside(self, *argv: str, nice: int = 0) -> dict:
        return json.loads(run(["nice", "-n", str(nice), sys.executable, __file__, "client", *argv]))

    def download(self, size: int, runs: int) -> list[float]:
        """Median seconds of a ``size``-byte download: through the proxy, directly, directly at nice
        19, and through the baseline's proxy when there is one; each party's CPU in
        :attr:`cpu_per_gb`."""
        daemons = [daemon_pid(self.name), None, None]
        if self.baseline is not None:
            daemons.append(daemon_pid(f"{self.name}-base", PYTHONPATH=str(self.baseline)))
        spent: list[list[float]] = [[0.0] * 3 for _ in daemons]
        seconds = self._in_turns(runs, "download", "127.0.0.1", str(self.port), str(size),
                                 value=lambda answer: answer["seconds"],
                                 spent=(spent, lambda case: [self.server_pid, daemons[case]]))
        gigabytes = runs * size / 1e9
        self.cpu_per_gb = [[total / gigabytes if party < 2 or daemon else None for party, total in enumerate(case)]
                           for case, daemon in zip(spent, daemons, strict=True)]
        return seconds

    def latency(self, count: int) -> list[list[float]]:
        """Median seconds to connected, to the tunnel open and to the first byte (each median
        apart), as :meth:`download`, in turns of :data:`BATCH` connections."""
        return self._in_turns(max(1, count // BATCH), "latency", "127.0.0.1", str(self.port), str(BATCH),
                              value=lambda answer: answer["marks"])

    def _in_turns(self, turns: int, *argv: str, value: Any,
                  spent: tuple[list[list[float]], Any] | None = None) -> list[Any]:
        """The client's median for ``argv`` in the sandbox through the proxy, on the host directly,
        on the host at the nice level the sandbox's commands run at (19), and in the baseline's
        sandbox through its proxy when there is one, taking turns. With ``spent`` (totals by case,
        and ``watched(case)``: process ids or None), each turn adds the client's CPU seconds, then
        those of the processes watched, to its case's totals."""
        cases: list[tuple[Any, list[float]]] = [
            (lambda: self.inside("--proxy", *argv), []),
            (lambda: self.outside(*argv), []),
            (lambda: self.outside(*argv, nice=COMMAND_NICE), []),
        ]
        if self.baseline is not None:
            cases.append((lambda: self.inside("--proxy", *argv, baseline=True), []))
        for _ in range(turns):
            for case, (measure, found) in enumerate(cases):
                pids = spent[1](case) if spent else []
                before = [cpu_seconds(pid) if pid else 0.0 for pid in pids]
                answer = measure()
                if spent:
                    totals = spent[0][case]
                    totals[0] += answer["cpu"]
                    for place, (pid, seconds) in enumerate(zip(pids, before, strict=True), 1):
                        totals[place] += cpu_seconds(pid) - seconds if pid else 0.0
                if "bytes" in answer:
                    assert answer["bytes"] == int(argv[-1]), answer
                got = value(answer)
                found.extend(got if isinstance(got, list) else [got])
        return [_median(found) for _, found in cases]

    def pip(self, index: str, cert: str | None, runs: int) -> tuple[list[float], str]:
        """Median seconds of ``pip install`` into a fresh venv: in the sandbox, on the host, and
        on the host at nice 19; and pip's versions."""
        options = ["install", "--isolated", "--no-cache-dir", "--index-url", index]
        sandbox_cert = []
        if cert:
            shutil.copy(cert, self.workspace / "index-ca.pem")
            os.chmod(self.workspace / "index-ca.pem", 0o644)
            sandbox_cert = ["--cert", str(self.workspace / "index-ca.pem")]
        times: list[list[float]] = [[], [], []]
        versions = ""
        for number in range(runs):
            venv = self.workspace / f"venv-{number}"
            run([CLI, "exec", "--name", self.name, "--timeout", "300", "--", "python3", "-m", "venv", str(venv)])
            answer = self.inside("timed", "--", f"{venv}/bin/python", "-m", "pip", *options, *sandbox_cert, *PACKAGES)
            times[0].append(_installed(answer, "in the sandbox"))
            for nice, found in ((0, times[1]), (COMMAND_NICE, times[2])):
                with tempfile.TemporaryDirectory(prefix="protolink-bench-venv-") as host_venv:
                    run([sys.executable, "-m", "venv", host_venv])
                    answer = self.outside("timed", "--", f"{host_venv}/bin/python", "-m", "pip", *options,
                                          *(["--cert", cert] if cert else []), *PACKAGES, nice=nice)
                    found.append(_installed(answer, "on the host"))
                    host_pip = run([f"{host_venv}/bin/python", "-m", "pip", "--version"]).split(" from")[0]
            sandbox_pip = run([CLI, "exec", "--name", self.name, "--", f"{venv}/bin/python", "-m", "pip",
                               "--version"]).split(" from")[0]
            versions = f"sandbox {sandbox_pip}, host {host_pip}"
        return [statistics.median(found) for found in times], versions


def _median(found: list[Any]) -> Any:
    """The median of numbers, or of each place of lists of numbers."""
    if found and isinstance(found[0], list):
        return [statistics.median(values) for values in zip(*found, strict=True)]
    return statistics.median(found)


def _installed(answer: dict, where: str) -> float:
    if answer["code"] != 0:
        sys.exit(f"pip install {where} failed:\n{answer['stderr']}")
    return float(answer["seconds"])


def row(what: str, sandbox: str, host: str, nice: str, ratio: str, target: str, met: bool,
        baseline: str = "") -> None:
    print(f"{what:<40}{sandbox:>12}{host:>12}{nice:>14}{ratio:>10}  {target:<10}{'met' if met else 'NOT met':<9}"
          f"{baseline}")


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
                measure(Bench(name, workspace, port, script, args.baseline, server.pid), args, index, cert, allow)
            finally:
                for appliance, env in started:
                    run([CLI, "down", "--name", appliance], **env)
    finally:
        server.kill()


def measure(bench: Bench, args: argparse.Namespace, index: str, cert: str | None, allow: list[str]) -> None:
    load = os.getloadavg()
    baseline = f", baseline's CPU {cpuset(bench.name + '-base')}" if args.baseline else ""
    print(f"appliance {bench.name} ({args.cpus} CPU: {cpuset(bench.name)}{baseline}), allowed: "
          f"{', '.join([f'127.0.0.1/32:{bench.port} (loopback server)', *allow])}; "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'':<40}{'sandbox':>12}{'host':>12}{'host nice 19':>14}{'ratio':>10}  target{'':<14}"
          + ("baseline (its sandbox; ratio)" if args.baseline else ""))
    size = args.size_mb * 1_000_000
    proxied, direct, niced, *before = bench.download(size, args.runs)
    ratio = direct / proxied
    row(f"{args.size_mb} MB download, median of {args.runs}", f"{size / proxied / 1e6:.0f} MB/s",
        f"{size / direct / 1e6:.0f} MB/s", f"{size / niced / 1e6:.0f} MB/s", f"{ratio:.2f}x",
        f">= {THROUGHPUT_TARGET}x", ratio >= THROUGHPUT_TARGET,
        "".join(f"{size / seconds / 1e6:.0f} MB/s; {direct / seconds:.2f}x" for seconds in before))

    def parties(case: list[float | None]) -> str:
        return "/".join("-" if seconds is None else f"{seconds:.2f}" for seconds in case)

    print(f"  CPU s per GB, client/server/daemon: sandbox {parties(bench.cpu_per_gb[0])}, host "
          f"{parties(bench.cpu_per_gb[1])}, host nice 19 {parties(bench.cpu_per_gb[2])}"
          + "".join(f", baseline {parties(case)}" for case in bench.cpu_per_gb[3:]))
    marks = bench.latency(args.connections)
    proxied, direct, niced, *before = (case[-1] for case in marks)
    added = (proxied - direct) * 1e3
    row(f"connect + first byte, median of {args.connections}", f"{proxied * 1e3:.2f} ms", f"{direct * 1e3:.2f} ms",
        f"{niced * 1e3:.2f} ms", f"+{added:.2f} ms", f"<= {LATENCY_TARGET_MS:g} ms", added <= LATENCY_TARGET_MS,
        "".join(f"{seconds * 1e3:.2f} ms; +{(seconds - direct) * 1e3:.2f} ms" for seconds in before))
    labels = ("connected", "CONNECT answered", "first byte")
    for where, case in (("sandbox", marks[0]), *((("baseline", marks[3]),) if before else ())):
        print(f"  {where}, medians from the start: "
              + ", ".join(f"{label} {mark * 1e3:.2f} ms" for label, mark in zip(labels, case, strict=True)))
    if args.pip_runs:
        (inside, outside, niced), versions = bench.pip(index, cert, args.pip_runs)
        row(f"pip install ({len(PACKAGES)} + deps), median of {args.pip_runs}", f"{inside:.1f} s", f"{outside:.1f} s",
            f"{niced:.1f} s", f"{inside / outside:.2f}x", f"<= {PIP_TARGET}x", inside / outside <= PIP_TARGET)
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
