"""Run a CI job: copy, set up with the allow-list, cut the network, test, collect, remove.

::

    workspace (fresh copy) ──► sandbox (the copy its one writable root; egress: the allow-list)
      setup commands, in order, /bin/sh -c, cwd = the copy, HOME beside it
      ──► egress deny-all (open connections closed)
      test command ──► its exit code is the job's
      ──► container removed ──► JUnit and artifacts collected ──► report ──► workspace removed

The whole job keeps within ``timeout_seconds``. The container, its egress proxy and the
workspace are removed however the job ends (a failure, the timeout, Ctrl-C, SIGTERM); a runner
killed outright leaves them to the next runner: the reaper removes containers whose owner is
gone and :func:`~protolink.sandbox.ci.workspace.sweep` such workspaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import re
import shlex
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from protolink.errors import RepositoryError, SandboxError
from protolink.execution.process_types import ProcessSpec
from protolink.wire.roots import Root
from protolink.wire.trust import ca_environment

from ..ca_file import copy_ca_file
from ..config import Identity
from ..disk import usage_bytes
from ..docker import DockerSandbox, engine_cpus
from ..egress.events import EgressEvent
from ..egress.policy import DENY_ALL
from ..provision import ensure_image
from ..typed import typed_argv
from ..usage import PidsPeak, memory_peak
from .collect import collect_artifacts, collect_junit, junit_totals
from .job import CiJob
from .progress import Masker, Progress, Silent
from .report import (
    EXIT_INTERRUPTED,
    EXIT_REPOSITORY,
    EXIT_RUNNER_ERROR,
    EXIT_SETUP_FAILED,
    EXIT_TIMED_OUT,
    CiReport,
    CommandRecord,
    PhaseRecord,
    iso,
)
from .workspace import Workspace, public_source, sweep

log = logging.getLogger(__name__)

#: Variables every command gets (``HOME`` is the workspace's ``home/``).
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
            "CI": "true", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}


class _Tail:
    """The last ``limit`` characters of a command's output, both channels as they came."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pieces: deque[str] = deque()
        self.size = 0

    def add(self, text: str) -> None:
        self.pieces.append(text)
        self.size += len(text)
        while self.size - len(self.pieces[0]) >= self.limit:
            self.size -= len(self.pieces.popleft())

    def text(self) -> str:
        return "".join(self.pieces)[-self.limit:]


class _Output:
    """Where a command's ``process.output`` events go: its tail and the progress display."""

    def __init__(self, tail: _Tail, progress: Progress) -> None:
        self.tail = tail
        self.progress = progress
        self.bytes = 0

    async def emit(self, type: str, **data: Any) -> None:
        if type == "process.output":
            text = data.get("text", "")
            self.bytes += len(text.encode("utf-8", "surrogatepass"))
            self.tail.add(text)
            self.progress.output(text)


class CiRunner:
    """One job (see the module); :meth:`run` returns its report, which says how it ended."""

    def __init__(self, job: CiJob, *, artifacts_dir: Path, progress: Progress | None = None,
                 host_env: dict[str, str] | None = None, name: str | None = None,
                 image_progress: Callable[[str], None] | None = None) -> None:
        self.job = job
        self.artifacts_dir = artifacts_dir
        self.passed_env = job.environment(host_env)  # ValueError before anything is made
        if job.junit and importlib.util.find_spec("junitparser") is None:
            raise ValueError("reading JUnit files needs junitparser and lxml: pip install 'protolink[ci]'")
        self.masker = Masker(self.passed_env.values())
        self.progress: Progress = progress or Silent()
        self.name = name
        self.image_progress = image_progress or (lambda line: log.info("%s", line))
        self.report = CiReport(source=public_source(job.repo), env=list(job.env), runtime=job.runtime)
        self.report.egress["allow"] = list(job.allow)
        self._deadline = 0.0
        self._workspace: Workspace | None = None
        self._sandbox: DockerSandbox | None = None
        self._pids: PidsPeak | None = None
        self._test_started_at: float | None = None  # time.time() when the test phase began

    async def run(self) -> CiReport:
        """Run the job to its end; the report (written nowhere: see :func:`run_job`)."""
        self._deadline = time.monotonic() + self.job.timeout_seconds
        task = asyncio.current_task()
        cancelling = task.cancelling() if task is not None else 0
        deadline = asyncio.timeout(self.job.timeout_seconds)
        try:
            async with deadline:
                await self._run()
        except TimeoutError:
            self._end_timed_out()
        except RepositoryError as error:
            self.report.end("repository_error", EXIT_REPOSITORY, str(error))
        except (SandboxError, OSError) as error:
            self.report.end("error", EXIT_RUNNER_ERROR, f"{type(error).__name__}: {error}")
        except asyncio.CancelledError:
            # asyncio.timeout turns only a plain CancelledError into TimeoutError: a command it
            # cancels raises ProcessCancelledError. No other cancellation pending: the deadline's.
            if deadline.expired() and task is not None and task.cancelling() <= cancelling:
                self._end_timed_out()
            else:
                self.report.end("interrupted", EXIT_INTERRUPTED, "interrupted")
                raise
        finally:
            await asyncio.shield(self._finish())
        return self.report

    async def _run(self) -> None:
        job = self.job
        with self._timed("image"):
            image = await asyncio.to_thread(ensure_image, job.image, self.image_progress)
        self.report.image = image
        identity = Identity.of()
        with self._timed("workspace"):
            await asyncio.to_thread(sweep)
            self._workspace = workspace = await asyncio.to_thread(Workspace.create, identity.uid, identity.gid)
            copied, commit = await asyncio.to_thread(workspace.fill, job.repo, max_bytes=job.disk_bytes,
                                                     timeout=self._remaining())
        self.report.repository.update(commit=commit, files=copied.files, directories=copied.directories,
                                      symlinks=copied.symlinks, bytes=copied.bytes, left_out=copied.left_out)
        env = {**BASE_ENV, "HOME": str(workspace.home), **self.passed_env}
        setup_env = env
        if job.ca_file is not None:
            # The trust variables (protolink.wire.trust) for the setup phase's commands only, not
            # the sandbox's ca_file, which every command gets: the test phase reaches no network,
            # and Node parses the whole bundle each time it starts (0.05 s of CPU; mocha starts
            # Node twice; bench/README.md).
            setup_env = {**env, **ca_environment(await asyncio.to_thread(self._install_ca, workspace))}
        cpus = job.cpus or float(await asyncio.to_thread(engine_cpus))  # a job without a bound may use them all
        self._sandbox = sandbox = DockerSandbox(
            roots=[Root(str(workspace.root), writable=True)], image=image, memory=job.memory, pids=job.pids,
            cpus=cpus, disk_bytes=job.disk_bytes, runtime=job.runtime,
            egress=job.egress if job.allow else None, on_egress_event=self._egress_event,
            **({"name": self.name} if self.name else {}))
        with self._timed("sandbox_start"):
            backend = await sandbox.start()
        self.report.container = sandbox.container_id
        self._pids = PidsPeak(await asyncio.to_thread(sandbox.host_pid))
        watch = asyncio.create_task(self._pids.watch())
        try:
            if await self._setup(backend, setup_env):
                if job.allow:
                    await sandbox.set_egress(DENY_ALL)
                await self._test(backend, env)
        finally:
            watch.cancel()
            self._pids.look()
            self._measure(sandbox)

    async def _setup(self, backend: Any, env: dict[str, str]) -> bool:
        """Run the setup commands in order; False once one fails (the job has ended)."""
        if not self.job.setup:
            return True
        phase = self._new_phase("setup", "allow-list" if self.job.allow else "none")
        for command in self.job.setup:
            record = await self._command(backend, phase, ["/bin/sh", "-c", command], command, env)
            if record.timed_out:
                self._end_timed_out()
                return False
            if record.exit_code != 0:
                code = _exit_status(record.exit_code)
                why = self._over_disk_budget() or _hint(code) or self._untrusted_certificate(record)
                self.report.end("setup_failed", EXIT_SETUP_FAILED,
                                f"setup command {command!r} exited {code}" + (f": {why}" if why else ""))
                return False
        return True

    async def _test(self, backend: Any, env: dict[str, str]) -> None:
        """Run the test command, with no network; its exit status ends the job."""
        test = self.job.test
        self._test_started_at = time.time()
        phase = self._new_phase("test", "none")
        argv = typed_argv(test)
        record = await self._command(backend, phase, argv, shlex.join(test), env)
        if record.timed_out:
            self._end_timed_out()
        else:
            code = _exit_status(record.exit_code)
            why = (self._over_disk_budget() or _hint(code)) if code else None
            self.report.end("passed" if code == 0 else "failed", code, why)

    def _untrusted_certificate(self, record: CommandRecord) -> str | None:
        """Why a setup command may have failed when its output says a TLS certificate was not
        trusted and the job gave no certificate authority (an intercepting proxy's)."""
        if self.job.ca_file is not None or not UNTRUSTED_CERTIFICATE.search(record.output_tail):
            return None
        return UNTRUSTED

    def _over_disk_budget(self) -> str | None:
        """Why the commands were stopped when the workspace grew past the disk budget, else None."""
        if self._sandbox is None or not self._sandbox.disk_budget_spent:
            return None
        return (f"the workspace grew past its disk budget of {self.job.disk_bytes} bytes: the sandbox stopped "
                "its commands")

    def _end_timed_out(self) -> None:
        """End the report as timed out, the command the deadline cut short marked so."""
        for phase in self.report.phases:
            for command in phase.commands:
                command.timed_out = command.timed_out or command.exit_code is None
        self.report.end("timed_out", EXIT_TIMED_OUT, f"the job took longer than {self.job.timeout_seconds:g} s")

    @contextlib.contextmanager
    def _timed(self, step: str) -> Iterator[None]:
        """Add the wall time of the block to the report's ``timings[step]``."""
        started = time.monotonic()
        try:
            yield
        finally:
            timings = self.report.timings
            timings[step] = round(timings.get(step, 0.0) + time.monotonic() - started, 3)

    def _new_phase(self, name: str, network: str) -> PhaseRecord:
        phase = PhaseRecord(name=name, network=network, started_at=iso(time.time()))
        self.report.phases.append(phase)
        self.progress.phase(name)
        return phase

    async def _command(self, backend: Any, phase: PhaseRecord, argv: list[str], text: str,
                       env: dict[str, str]) -> CommandRecord:
        assert self._workspace is not None
        record = CommandRecord(argv=[self.masker(arg) for arg in argv])
        phase.commands.append(record)
        self.progress.command(phase.name, text)
        output = _Output(_Tail(self.job.limits.tail_bytes), self.progress)
        spec = ProcessSpec(argv=tuple(argv), cwd=str(self._workspace.repo), env=env,
                           timeout_seconds=max(self._remaining(), 0.001),
                           max_output_bytes=self.job.limits.command_output_bytes)
        started = time.monotonic()
        try:
            result = await backend.execute(spec, output)
        finally:
            record.duration_seconds = round(time.monotonic() - started, 3)
            phase.duration_seconds = round(sum(command.duration_seconds for command in phase.commands), 3)
            record.output_bytes = output.bytes
            record.output_tail = self.masker(output.tail.text())
        record.exit_code, record.timed_out, record.truncated = result.exit_code, result.timed_out, result.truncated
        state = "timed out" if result.timed_out else f"exit {_exit_status(result.exit_code)}"
        self.progress.ended(f"{phase.name}: {state} in {record.duration_seconds:.1f} s: {text}")
        return record

    def _remaining(self) -> float:
        return self._deadline - time.monotonic()

    def _install_ca(self, workspace: Workspace) -> str:
        assert self.job.ca_file is not None
        target = workspace.home / "ca-certificates.pem"
        copy_ca_file(self.job.ca_file, target)
        return str(target)

    def _egress_event(self, event: EgressEvent) -> None:
        # A connection's events belong to the phase it was opened in: the end of one the setup
        # left open (npm keeps its connections alive) may be reported after the test began.
        opened_at = event.timestamp - event.duration_seconds
        testing = self._test_started_at is not None and opened_at >= self._test_started_at
        self.report.egress["decisions"].append({
            "phase": "test" if testing else "setup", "kind": event.kind, "host": event.host, "port": event.port,
            "address": event.address, "reason": event.reason, "method": event.method,
            "bytes_up": event.bytes_up, "bytes_down": event.bytes_down, "at": iso(event.timestamp)})

    def _measure(self, sandbox: DockerSandbox) -> None:
        resources = self.report.resources
        with contextlib.suppress(Exception):  # a container already gone has nothing to say
            resources["memory_peak_bytes"] = memory_peak(sandbox.host_pid())
        resources["pids_peak"] = self._pids.peak if self._pids else None
        if self._workspace is not None:
            resources["disk_used_bytes"] = usage_bytes([str(self._workspace.root)]).bytes

    async def _finish(self) -> None:
        """Remove the container, collect what the job left out of it, remove the workspace."""
        self.progress.close()
        if self._sandbox is not None:
            with self._timed("sandbox_stop"):
                await self._sandbox.aclose()
        workspace = self._workspace
        if workspace is None:
            return
        try:
            with self._timed("collect"):
                await self._collect(workspace)
        finally:
            with self._timed("cleanup"):
                await asyncio.to_thread(workspace.remove)

    async def _collect(self, workspace: Workspace) -> None:
        """JUnit files and artifacts out of the workspace, once its container is gone."""
        job = self.job
        if not workspace.repo.is_dir() or not (job.junit or job.artifacts):
            return
        if job.junit:
            junit = await asyncio.to_thread(collect_junit, workspace.repo, job.junit, self.artifacts_dir, job.limits)
            self.report.junit = {**junit.to_dict(), "totals": junit_totals(junit)}
        if job.artifacts:
            out = self.artifacts_dir / "artifacts"
            artifacts = await asyncio.to_thread(collect_artifacts, workspace.repo, job.artifacts, out, job.limits)
            self.report.artifacts = {"directory": str(out), **artifacts.to_dict()}


#: Why a command may exit 126 here when it would not on the host.
NOT_EXECUTABLE = ("126 is a shell's 'found but could not be run': in the sandbox /tmp and /dev/shm are mounted "
                  "noexec, so keep programs (a venv, a downloaded tool) in the repository")


#: What tools print when a server's certificate is not trusted: OpenSSL's users (pip, Ruby),
#: curl and git, npm, Go, Rust (rustls), Java.
UNTRUSTED_CERTIFICATE = re.compile(
    r"certificate verify failed|SSL certificate problem|SELF_SIGNED_CERT_IN_CHAIN|DEPTH_ZERO_SELF_SIGNED_CERT"
    r"|UNABLE_TO_GET_ISSUER_CERT|UNABLE_TO_VERIFY_LEAF_SIGNATURE|certificate signed by unknown authority"
    r"|invalid peer certificate|PKIX path building failed", re.IGNORECASE)
#: Why a setup command whose output says so may have failed.
UNTRUSTED = ("a server's TLS certificate was not trusted: behind a proxy that intercepts TLS, give its "
             "certificate authority with --ca-file PEM (CiJob(ca_file=...))")


def _hint(code: int) -> str | None:
    """What the sandbox may have to do with a command's exit status ``code``, if anything."""
    return NOT_EXECUTABLE if code == 126 else None


def _exit_status(code: int | None) -> int:
    """A shell's exit status for an exit code (a signal ``-N``: ``128 + N``)."""
    if code is None:
        return EXIT_RUNNER_ERROR
    return 128 - code if code < 0 else code


async def run_job(job: CiJob, *, artifacts_dir: Path | str = "ci-artifacts", report_path: Path | str | None = None,
                  progress: Progress | None = None, host_env: dict[str, str] | None = None,
                  name: str | None = None) -> CiReport:
    """Run ``job`` (see the module) and return its report, also written to ``report_path``
    when given (whole or not at all). JUnit files and artifacts go to ``artifacts_dir``."""
    runner = CiRunner(job, artifacts_dir=Path(artifacts_dir), progress=progress, host_env=host_env, name=name)
    try:
        return await runner.run()
    finally:
        if report_path is not None:
            runner.report.write(Path(report_path))


def run_job_sync(job: CiJob, **options: Any) -> CiReport:
    """:func:`run_job` for scripts: runs it in a new event loop."""
    return asyncio.run(run_job(job, **options))
