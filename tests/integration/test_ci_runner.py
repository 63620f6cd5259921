"""The CI runner through its Python API, on the sandbox image (npm and a CA file: the CI image): how jobs end
and what they leave."""

from __future__ import annotations

import json
import os
import shutil
import sys

import docker
import pytest

from protolink.sandbox.ci import CiJob, run_job
from protolink.sandbox.ci.report import EXIT_REPOSITORY, EXIT_RUNNER_ERROR, EXIT_SETUP_FAILED
from protolink.sandbox.ci.runner import UNTRUSTED
from protolink.sandbox.service.tls import ensure_certificate

pytestmark = pytest.mark.docker

JUNIT = ('<testsuites><testsuite name="s"><testcase name="a"/><testcase name="b"><skipped/></testcase>'
         '</testsuite></testsuites>')


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    base = tmp_path / "jobs"
    monkeypatch.setenv("PROTOLINK_CI_DIR", str(base))
    return base


def _repo(tmp_path, script: str):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "check.py").write_text(script)
    return repo


def _left(jobs) -> list[str]:
    return sorted(path.name for path in jobs.iterdir()) if jobs.exists() else []


def _container_gone(container_id: str | None) -> bool:
    client = docker.from_env()
    try:
        client.containers.get(container_id)
        return False
    except docker.errors.NotFound:
        return True
    finally:
        client.close()


async def test_a_passing_job_reports_its_phases_results_and_resources(tmp_path, jobs, sandbox_image):
    repo = _repo(tmp_path, "import pathlib, sys\n"
                           "print('setup left', pathlib.Path('built.txt').read_text())\n"
                           f"pathlib.Path('reports').mkdir(); pathlib.Path('reports/junit.xml').write_text({JUNIT!r})\n"
                           "pathlib.Path('dist').mkdir(); pathlib.Path('dist/app.txt').write_text('artifact')\n")
    job = CiJob(repo=str(repo), image=sandbox_image, setup=["echo built > built.txt", "echo $HOME"],
                test=["python3", "check.py"], junit=["reports/*.xml"], artifacts=["dist/**"])
    report = await run_job(job, artifacts_dir=tmp_path / "out", report_path=tmp_path / "report.json")
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["phases"] == report.to_dict()["phases"]  # the file holds what the call returned
    assert (data["outcome"], data["exit_code"], data["error"]) == ("passed", 0, None)
    setup, test = data["phases"]
    assert [command["exit_code"] for command in setup["commands"]] == [0, 0]
    assert setup["commands"][1]["output_tail"].strip().endswith("/workspace/home")
    assert test["commands"][0]["output_tail"] == "setup left built\n\n"
    assert setup["network"] == test["network"] == "none"
    assert data["junit"]["totals"] == {"tests": 2, "passed": 1, "failures": 0, "errors": 0, "skipped": 1}
    assert [item["path"] for item in data["artifacts"]["files"]] == ["dist/app.txt"]
    assert (tmp_path / "out" / "artifacts" / "dist" / "app.txt").read_text() == "artifact"
    resources = data["resources"]
    assert resources["memory_peak_bytes"] > 0 and resources["pids_peak"] >= 1 and resources["disk_used_bytes"] > 0
    assert data["image"] == sandbox_image and _container_gone(data["container"])
    assert _left(jobs) == []
    assert not (repo / "built.txt").exists()  # the checkout was copied, never mounted


@pytest.mark.parametrize("script, code", [("raise SystemExit(7)", 7),
                                          ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + 9)])
async def test_the_test_commands_exit_status_is_the_jobs(tmp_path, jobs, sandbox_image, script, code):
    job = CiJob(repo=str(_repo(tmp_path, script)), image=sandbox_image, test=["python3", "check.py"])
    report = await run_job(job, artifacts_dir=tmp_path / "out")
    assert (report.outcome, report.exit_code) == ("failed", code)
    assert _left(jobs) == []


async def test_a_job_that_names_no_junit_files_reports_no_test_counts(tmp_path, jobs, sandbox_image):
    repo = _repo(tmp_path, "import pathlib; pathlib.Path('out').mkdir(); pathlib.Path('out/log.txt').write_text('x')")
    job = CiJob(repo=str(repo), image=sandbox_image, test=["python3", "check.py"], artifacts=["out/**"])
    report = await run_job(job, artifacts_dir=tmp_path / "out")
    assert report.outcome == "passed" and report.junit == {}  # not "0 passed": nothing was counted
    assert [item["path"] for item in report.artifacts["files"]] == ["out/log.txt"]
    assert _left(jobs) == []


async def test_a_failing_setup_command_ends_the_job_before_the_tests(tmp_path, jobs, sandbox_image):
    job = CiJob(repo=str(_repo(tmp_path, "")), image=sandbox_image, setup=["echo trying; exit 3", "echo never"],
                test=["python3", "check.py"])
    report = await run_job(job, artifacts_dir=tmp_path / "out")
    assert (report.outcome, report.exit_code) == ("setup_failed", EXIT_SETUP_FAILED)
    assert "exited 3" in report.error
    assert [phase.name for phase in report.phases] == ["setup"]
    assert [command.exit_code for command in report.phases[0].commands] == [3]
    assert report.phases[0].commands[0].output_tail == "trying\n"
    assert _container_gone(report.container) and _left(jobs) == []


async def test_a_program_put_in_tmp_fails_with_a_hint_that_tmp_is_noexec(tmp_path, jobs, sandbox_image):
    job = CiJob(repo=str(_repo(tmp_path, "")), image=sandbox_image,
                setup=["printf '#!/bin/sh\\necho built\\n' > /tmp/tool && chmod +x /tmp/tool && /tmp/tool"],
                test=["python3", "check.py"])
    report = await run_job(job, artifacts_dir=tmp_path / "out")
    assert (report.outcome, report.exit_code) == ("setup_failed", EXIT_SETUP_FAILED)
    assert report.phases[0].commands[0].output_tail.endswith("/tmp/tool: Permission denied\n")
    assert report.error.startswith(f"setup command {job.setup[0]!r} exited 126: ")
    assert "/tmp and /dev/shm are mounted noexec" in report.error
    assert _left(jobs) == []


async def test_a_repository_that_is_not_there_starts_no_sandbox(tmp_path, jobs, sandbox_image):
    job = CiJob(repo=str(tmp_path / "missing"), image=sandbox_image, test=["true"])
    report = await run_job(job, artifacts_dir=tmp_path / "out")
    assert (report.outcome, report.exit_code, report.container) == ("repository_error", EXIT_REPOSITORY, None)
    assert _left(jobs) == []


async def test_an_image_that_does_not_exist_is_the_runners_failure(tmp_path, jobs):
    job = CiJob(repo=str(_repo(tmp_path, "")), image="protolink/no-such-image:never", test=["true"])
    report = await run_job(job, artifacts_dir=tmp_path / "out")
    assert (report.outcome, report.exit_code) == ("error", EXIT_RUNNER_ERROR)
    assert "does not exist" in report.error
    assert _left(jobs) == []


def test_the_command_line_runs_a_job_and_writes_its_report(tmp_path, jobs, sandbox_image):
    import subprocess

    repo = _repo(tmp_path, "print('from the test')\nraise SystemExit(5)\n")
    cli = os.path.join(os.path.dirname(sys.executable), "protolink-sandbox")
    done = subprocess.run([cli, "ci", str(repo), "--image", sandbox_image, "--report", str(tmp_path / "r.json"),
                           "--artifacts-dir", str(tmp_path / "out"), "--", "python3", "check.py"],
                          capture_output=True, text=True, timeout=600, env={**os.environ})
    assert done.returncode == 5, done.stderr
    assert done.stdout == "from the test\n"
    assert "ci: test: $ python3 check.py" in done.stderr and "ci: failed (exit 5)" in done.stderr
    assert json.loads((tmp_path / "r.json").read_text())["outcome"] == "failed"
    assert _left(jobs) == []


#: Serves npm's ping over TLS on the loopback with the certificate in the repository, runs `npm ping`
#: against it (no retries: a refusal fails at once), and exits with npm's status.
NPM_PING = """
const {spawn} = require("child_process"), fs = require("fs"), https = require("https");
const tls = {cert: fs.readFileSync("cert.pem"), key: fs.readFileSync("key.pem")};
const server = https.createServer(tls, (request, answer) => answer.writeHead(200).end("{}"));
server.listen(0, "127.0.0.1", () => {
  const registry = `https://127.0.0.1:${server.address().port}/`;
  const npm = spawn("npm", ["ping", "--registry", registry, "--fetch-retries", "0"], {stdio: "inherit"});
  npm.on("exit", code => { server.close(); process.exit(code); });
});
"""


@pytest.mark.parametrize("trusted", [True, False], ids=["with-ca-file", "without"])
async def test_npm_trusts_the_jobs_certificate_authority_during_setup(tmp_path, jobs, ci_image, trusted):
    """The setup phase's npm trusts the job's CA file, and only then; the test phase, which
    reaches no network, is not given it."""
    certificate = ensure_certificate(tmp_path / "tls")  # self-signed for 127.0.0.1: its own authority
    repo = _repo(tmp_path, "")
    (repo / "ping.js").write_text(NPM_PING)
    shutil.copyfile(certificate.certificate_path, repo / "cert.pem")
    shutil.copyfile(certificate.key_path, repo / "key.pem")
    job = CiJob(repo=str(repo), image=ci_image, setup=["node ping.js"], test=["node", "ping.js"],
                ca_file=certificate.certificate_path if trusted else None)
    report = await run_job(job, artifacts_dir=tmp_path / "out")
    exit_codes = [command.exit_code == 0 for phase in report.phases for command in phase.commands]
    assert exit_codes == ([True, False] if trusted else [False]), report.phases[-1].commands[0].output_tail
    assert report.outcome == ("failed" if trusted else "setup_failed")
    assert ("--ca-file" in (report.error or "")) == (not trusted)  # the hint, when the CA was missing
    assert _left(jobs) == []


#: Serves HTTPS on the loopback with the certificate in the repository and fetches from it with
#: Python's urllib (as pip would), trusting only the system's authorities.
PYTHON_FETCH = """
import http.server, ssl, threading, urllib.request
server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("cert.pem", "key.pem")
server.socket = context.wrap_socket(server.socket, server_side=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
urllib.request.urlopen(f"https://127.0.0.1:{server.server_port}/", timeout=10)
"""


async def test_a_setup_refused_by_an_untrusted_certificate_hints_at_the_ca_file(tmp_path, jobs, sandbox_image):
    """Behind a proxy that intercepts TLS, pip fails with CERTIFICATE_VERIFY_FAILED: the job's
    error says to give the proxy's authority with --ca-file."""
    certificate = ensure_certificate(tmp_path / "tls")
    repo = _repo(tmp_path, PYTHON_FETCH)
    shutil.copyfile(certificate.certificate_path, repo / "cert.pem")
    shutil.copyfile(certificate.key_path, repo / "key.pem")
    job = CiJob(repo=str(repo), image=sandbox_image, setup=["python3 check.py"], test=["true"])
    report = await run_job(job, artifacts_dir=tmp_path / "out")
    assert (report.outcome, report.exit_code) == ("setup_failed", EXIT_SETUP_FAILED)
    assert "CERTIFICATE_VERIFY_FAILED" in report.phases[0].commands[0].output_tail
    assert report.error == f"setup command 'python3 check.py' exited 1: {UNTRUSTED}"
    assert _left(jobs) == []
