"""Where the JavaScript validation project's test command spends its time, case by case.

Needs a Docker Engine, the CI image (built when missing) and the npm registry once::

    python bench/ci_split.py [--rounds N] [--repeat N]

domhandler's mocha (``node_modules`` installed once by the image's npm) runs in turns: on the
host; in a plain ``docker run`` of the CI image (no network), alone and with one of the
runner's settings at a time (the seccomp filters, nice 19, the proxy variables, a CFS quota);
and through ``DockerSandbox`` (the server, its spawner and filters), each with and without the
host's CA bundle as ``NODE_EXTRA_CA_CERTS``. Each case is timed inside its container (median
of ``--repeat`` runs, wall and CPU); the table gives each case's median over the rounds and its
ratio to the plain container.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protolink.execution.process_types import NO_EVENTS, ProcessSpec  # noqa: E402
from protolink.sandbox.config import Root  # noqa: E402
from protolink.sandbox.docker import DockerSandbox, engine_cpus  # noqa: E402
from protolink.sandbox.provision import ensure_image  # noqa: E402
from protolink.wire.protections import seccomp_profile  # noqa: E402
from tests.ci_projects import JAVASCRIPT_PROJECTS, unpack  # noqa: E402
from tests.ci_runs import CA_FILE  # noqa: E402

TEST = ("node_modules/.bin/mocha", "--reporter", "xunit", "--reporter-options", "output=/tmp/junit.xml")
PROXY = {name: "http://127.0.0.1:9/" for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")}
COMMAND_PATH = "/usr/local/bin:/usr/bin:/bin"
TIMEOUT_SECONDS = 300

#: Runs the command REPEAT times at the nice value given; prints the median wall and CPU seconds.
_TIMER = r"""
import json, os, resource, statistics, subprocess, sys, time
argv, repeat, nice = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
walls, cpus = [], []
for _ in range(repeat):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   preexec_fn=(lambda: os.nice(nice)) if nice else None)
    walls.append(time.perf_counter() - started)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
print(json.dumps([statistics.median(walls), statistics.median(cpus)]))
"""
#: Loads the project's seccomp profile as the sandbox's server does (on top of the container's), then times.
_FILTERED = r"""
import json, os, sys
from protolink_sandboxd import seccomp_filter
from protolink.wire.protections import seccomp_profile
seccomp_filter.load(json.loads(seccomp_profile()))
os.execv("/usr/bin/python3", ["python3", *sys.argv[1:]])
"""

Timing = tuple[float, float]


def install(repository: Path, image: str) -> None:
    """domhandler unpacked into ``repository`` with its ``node_modules`` from the image's npm."""
    unpack(JAVASCRIPT_PROJECTS[0], repository)
    subprocess.run(["docker", "run", "--rm", "--network", "host", "--user", f"{os.getuid()}:{os.getgid()}",
                    "-e", "HOME=/tmp", "-e", f"NODE_EXTRA_CA_CERTS={CA_FILE}", "-v", f"{CA_FILE}:{CA_FILE}:ro",
                    "-v", f"{repository}:{repository}", "-w", str(repository), "--entrypoint", "npm", image,
                    "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                   check=True, capture_output=True, timeout=TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)


class Cases:
    """The ways of running the test command, each returning its median wall and CPU seconds."""

    def __init__(self, image: str, repository: Path, seccomp: Path, repeat: int) -> None:
        self.image, self.repository, self.repeat = image, repository, repeat
        self.hardening = ["--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                          "--security-opt", f"seccomp={seccomp}"]

    def _timer(self, nice: int = 0) -> list[str]:
        return ["-c", _TIMER, json.dumps(TEST), str(self.repeat), str(nice)]

    def _environment(self, ca: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"HOME": "/tmp", "CI": "true", **({"NODE_EXTRA_CA_CERTS": CA_FILE} if ca else {}), **(extra or {})}

    def host(self, *, ca: bool) -> Timing:
        env = {**os.environ, **self._environment(ca)}
        if not ca:
            env.pop("NODE_EXTRA_CA_CERTS", None)
        done = subprocess.run([sys.executable, *self._timer()], cwd=self.repository, env=env, check=True,
                              capture_output=True, text=True, timeout=TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
        return tuple(json.loads(done.stdout))

    def plain(self, *, ca: bool = True, options: tuple[str, ...] = (), nice: int = 0, filtered: bool = False,
              env: dict[str, str] | None = None) -> Timing:
        argv = ["docker", "run", "--rm", "--network", "none", "--user", f"{os.getuid()}:{os.getgid()}",
                "-v", f"{CA_FILE}:{CA_FILE}:ro", "-v", f"{self.repository}:{self.repository}:ro",
                "-w", str(self.repository), *options,
                *(f"--env={name}={value}" for name, value in self._environment(ca, env).items())]
        if filtered:
            argv += ["--entrypoint", "/opt/protolink/bin/python", self.image, "-I", "-c", _FILTERED, *self._timer(nice)]
        else:
            argv += ["--entrypoint", "python3", self.image, *self._timer(nice)]
        done = subprocess.run(argv, check=True, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
                              stdin=subprocess.DEVNULL)
        return tuple(json.loads(done.stdout))

    def sandboxed(self, *, ca: bool) -> Timing:
        return asyncio.run(self._sandboxed(ca))

    async def _sandboxed(self, ca: bool) -> Timing:
        cpus = float(await asyncio.to_thread(engine_cpus))  # as the runner's job without a bound
        async with DockerSandbox(roots=[Root(str(self.repository), writable=False)], image=self.image,
                                 cpus=cpus) as backend:
            env = {"PATH": COMMAND_PATH, **self._environment(ca)}
            spec = ProcessSpec(("/usr/bin/python3", *self._timer()), str(self.repository), env, TIMEOUT_SECONDS,
                               1 << 20)
            result = await backend.execute(spec, NO_EVENTS)
        if result.exit_code != 0:
            raise RuntimeError(f"the timer failed in the sandbox: {result.stderr}")
        return tuple(json.loads(result.stdout))

    def table(self) -> dict[str, Callable[[], Timing]]:
        return {
            "host": lambda: self.host(ca=True),
            "host, no NODE_EXTRA_CA_CERTS": lambda: self.host(ca=False),
            "plain": lambda: self.plain(),
            "plain, no NODE_EXTRA_CA_CERTS": lambda: self.plain(ca=False),
            "plain, seccomp unconfined": lambda: self.plain(options=("--security-opt", "seccomp=unconfined")),
            "plain, the project's profile (Docker)": lambda: self.plain(options=tuple(self.hardening)),
            "plain, that and the server's filter": lambda: self.plain(options=tuple(self.hardening), filtered=True),
            "plain, nice 19": lambda: self.plain(nice=19),
            "plain, the proxy variables": lambda: self.plain(env=PROXY),
            "plain, --cpus 2 (a CFS quota)": lambda: self.plain(options=("--cpus", "2")),
            "sandbox": lambda: self.sandboxed(ca=True),
            "sandbox, no NODE_EXTRA_CA_CERTS": lambda: self.sandboxed(ca=False),
        }


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    image = ensure_image("ci", progress=lambda line: None)
    with tempfile.TemporaryDirectory(prefix="bench-ci-split-") as scratch:
        repository, seccomp = Path(scratch) / "domhandler", Path(scratch) / "seccomp.json"
        seccomp.write_text(seccomp_profile())
        install(repository, image)
        cases = Cases(image, repository, seccomp, args.repeat).table()
        print(f"domhandler's mocha, median of {args.repeat} per case, {args.rounds} rounds in turns "
              f"(image {image}; load {load()})", flush=True)
        timings: dict[str, list[Timing]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, case in cases.items():
                timings[name].append(case())
    plain_wall, plain_cpu = (statistics.median(timing[i] for timing in timings["plain"]) for i in (0, 1))
    print("| case | wall, median (each round) | against plain | CPU, median | against plain |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in timings.items():
        wall, cpu = (statistics.median(timing[i] for timing in runs) for i in (0, 1))
        rounds = " ".join(f"{timing[0]:.2f}" for timing in runs)
        print(f"| {name} | {wall:.3f} s ({rounds}) | {wall / plain_wall:.2f}x | {cpu:.3f} s | {cpu / plain_cpu:.2f}x |")
    print(f"load at the end {load()}")


if __name__ == "__main__":
    main()
