"""``protolink-sandbox ci REPO [options] -- TEST_CMD...``: the CI runner on the command line.

Exit status: the test command's own, when it ran to its end; else one of the runner's
(:mod:`protolink.sandbox.ci.report`): 2 usage, 120 a setup command failed, 121 the repository
could not be fetched or copied, 124 the job timed out, 125 the runner or the sandbox failed,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM). The report's ``outcome`` tells them apart
from a test command that exits with the same number.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from typing import TYPE_CHECKING, Any

from .progress import Masker, PlainLines, Progress, StatusLine
from .report import EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE

if TYPE_CHECKING:  # the parser is built for every verb, and `exec` is timed: the runner loads in `run`
    from .job import CiJob
    from .runner import CiRunner

MiB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ci`` verb's options."""
    parser.add_argument("repo", metavar="REPO", help="a local directory or a git URL (cloned on this host)")
    parser.add_argument("--setup", action="append", default=[], metavar="CMD",
                        help="a shell command run before the tests, with the --allow hosts reachable; repeatable")
    parser.add_argument("--allow", action="append", default=[], metavar="HOST[:PORT]",
                        help="a host the setup commands may reach (ports 80 and 443, or PORT); repeatable. "
                             "Without: no network. The tests never have one")
    parser.add_argument("--image", default="ci",
                        help='"ci" (default: compilers, Node.js; built when needed), "sandbox" (the small image), '
                             "or any image that holds the server (docs/images.md)")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="the whole job's limit in seconds")
    parser.add_argument("--report", type=Path, default=None, metavar="FILE", help="write the JSON report here")
    parser.add_argument("--junit", action="append", default=[], metavar="GLOB",
                        help="JUnit XML files to collect and count, relative to the repository; repeatable")
    parser.add_argument("--artifacts", action="append", default=[], metavar="GLOB",
                        help="files to collect, relative to the repository (** for any depth); repeatable")
    parser.add_argument("--artifacts-dir", type=Path, default=Path("ci-artifacts"), metavar="DIR",
                        help="where collected files go (default ./ci-artifacts)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME",
                        help="pass this host variable in (its value is masked in output and never reported)")
    parser.add_argument("--ca-file", type=Path, default=None, metavar="PEM",
                        help="a certificate authority bundle the setup commands' tools trust (an intercepting proxy)")
    parser.add_argument("--memory-mib", type=int, default=4096)
    parser.add_argument("--pids", type=int, default=2048)
    parser.add_argument("--cpus", type=float, default=None, help="default: every CPU of the engine")
    parser.add_argument("--disk-mib", type=int, default=8192, help="how much the workspace may grow")
    parser.add_argument("--output-mib", type=int, default=16,
                        help="output kept of each command (the rest is dropped, the command marked truncated; "
                             "the report's tail is the end of what was kept)")
    parser.add_argument("--runtime", default=None, help='e.g. "runsc" (gVisor), where installed')
    parser.add_argument("--name", default=None, help="the job's container name (default: a fresh one)")
    parser.set_defaults(test=[])  # what follows `--` (split off before parsing: see split_test)


def split_test(argv: list[str]) -> tuple[list[str], list[str]]:
    """The ``ci`` arguments before ``--`` and the test command after it: argparse would take an
    option after REPO for part of the test command, or an option of the test command for its own."""
    if "--" not in argv:
        return argv, []
    index = argv.index("--")
    return argv[:index], argv[index + 1:]


def job_of(args: argparse.Namespace) -> CiJob:
    """The job the parsed arguments describe; ValueError naming what is wrong."""
    from .job import CiJob, OutputLimits

    test = args.test
    if not test:
        raise ValueError("ci needs a test command: protolink-sandbox ci REPO -- TEST_CMD [ARG...]")
    return CiJob(repo=args.repo, test=tuple(test), setup=tuple(args.setup), allow=tuple(args.allow),
                 image=args.image, timeout_seconds=args.timeout,
                 junit=tuple(args.junit), artifacts=tuple(args.artifacts), env=tuple(args.env), ca_file=args.ca_file,
                 memory=args.memory_mib * MiB, pids=args.pids, cpus=args.cpus, disk_bytes=args.disk_mib * MiB,
                 runtime=args.runtime, limits=OutputLimits(command_output_bytes=args.output_mib * MiB))


def run(args: argparse.Namespace) -> int:
    """Run the job the arguments describe; the exit status (see the module)."""
    from .runner import CiRunner

    try:
        job = job_of(args)
        runner = CiRunner(job, artifacts_dir=args.artifacts_dir, image_progress=_stderr, name=args.name)
    except ValueError as error:
        print(f"protolink-sandbox ci: {error}", file=sys.stderr)
        return EXIT_USAGE
    runner.progress = _progress(runner.masker)
    return asyncio.run(_main(runner, args.report))


async def _main(runner: CiRunner, report_path: Path | None) -> int:
    task = asyncio.current_task()
    assert task is not None
    terminated = []

    def terminate() -> None:
        terminated.append(True)
        task.cancel()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, terminate)
    ticker = asyncio.create_task(_tick(runner.progress))
    try:
        report = await runner.run()
    except asyncio.CancelledError:
        report = runner.report
        if terminated:
            report.outcome, report.exit_code, report.error = "interrupted", EXIT_TERMINATED, "terminated (SIGTERM)"
        task.uncancel()
    finally:
        ticker.cancel()
        loop.remove_signal_handler(signal.SIGTERM)
        if report_path is not None:
            runner.report.write(report_path)
    _summary(report.to_dict())
    return report.exit_code if report.outcome != "interrupted" or terminated else EXIT_INTERRUPTED


async def _tick(progress: Progress) -> None:
    tick = getattr(progress, "tick", None)
    while tick is not None:
        await asyncio.sleep(0.5)
        tick()


def _progress(masker: Masker) -> Progress:
    return StatusLine(masker) if sys.stderr.isatty() else PlainLines(masker)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _summary(report: dict[str, Any]) -> None:
    """The job's end in a few lines on stderr."""
    totals = report.get("junit", {}).get("totals")
    tests = (f"; tests: {totals['passed']} passed, {totals['failures']} failed, {totals['errors']} errors, "
             f"{totals['skipped']} skipped" if totals else "")
    line = f"ci: {report['outcome']} (exit {report['exit_code']}) in {report['duration_seconds']:.1f} s{tests}"
    if report.get("error"):
        line += f": {report['error']}"
    print(line, file=sys.stderr, flush=True)
    if report["outcome"] != "passed":
        for phase in report["phases"]:
            for command in phase["commands"]:
                if command["exit_code"] != 0 and command["output_tail"]:
                    print(f"ci: last output of {phase['name']} command:\n{command['output_tail']}",
                          file=sys.stderr, flush=True)
