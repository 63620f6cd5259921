"""Hostile repositories through the git tool: configured programs never run, except the clean
filters the spec says may run; those run contained in the sandbox, like any command."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import CANARY, NOBODY, Attacker, still_serves

pytestmark = pytest.mark.docker

#: A program a hostile repository configures: it leaves a marker named after itself.
EVIL = "#!/bin/sh\ntouch \"$(dirname \"$0\")/ran-$(basename \"$0\")\"\ncat\n"


async def hostile_repo(attacker: Attacker, *config: str, programs: tuple[str, ...] = ()) -> Path:
    """A repository with one commit and one modified file, made by a command in the sandbox (so the
    command user owns it), with ``config`` lines set and ``programs`` installed beside it."""
    repo = attacker.ws / "repo"
    for name in programs:
        (attacker.ws / name).write_text(EVIL)
        (attacker.ws / name).chmod(0o755)
    settings = " && ".join(f"git config {line}" for line in config) or "true"
    script = (f"git init -q repo && cd repo && git config user.email a@b && git config user.name a && "
              f"echo one > file.txt && git add file.txt && git commit -q -m one && echo two >> file.txt && {settings}")
    result = await attacker.shell(script)
    assert result.exit_code == 0, result
    return repo


def markers(attacker: Attacker) -> list[str]:
    return sorted(path.name for path in attacker.ws.glob("ran-*"))


async def plain_git(attacker: Attacker, script: str) -> list[str]:
    """The markers left by plain ``git`` (none of the tool's switches) in the repository: the
    control that shows the repository is hostile."""
    await attacker.shell(f"cd repo && {script}")
    return markers(attacker)


async def every_operation(attacker: Attacker, repo: Path) -> None:
    """status, diff (worktree, staged, a revision), log, show, add and commit through the tool."""
    for operation, arguments in (("status", {}), ("diff", {}), ("diff", {"staged": True}),
                                 ("diff", {"revision": "HEAD"}), ("log", {}), ("show", {}),
                                 ("add", {"paths": ["file.txt"]}), ("commit", {"message": "two"}), ("log", {})):
        result = await attacker.git(repo, operation, **arguments)
        assert result.exit_code == 0, (operation, result)


async def test_hooks(attacker):
    """A repository with pre-commit, commit-msg, post-commit, post-index-change and reference-transaction hooks, and core.hooksPath pointing at more.

    No hook runs on any git operation (hooks are switched off per call); the commit is made. Plain git, as a control, runs them.
    """
    repo = await hostile_repo(attacker, f"core.hooksPath {attacker.ws}/hooks")
    (attacker.ws / "hooks").mkdir()
    for name in ("pre-commit", "commit-msg", "post-commit", "post-index-change", "reference-transaction",
                 "prepare-commit-msg", "post-checkout"):
        for directory in (repo / ".git" / "hooks", attacker.ws / "hooks"):
            (directory / name).write_text(f"#!/bin/sh\ntouch {attacker.ws}/ran-{name}\n")
            (directory / name).chmod(0o755)
    await every_operation(attacker, repo)
    assert markers(attacker) == []
    assert "two" in (await attacker.git(repo, "log")).stdout
    assert "ran-pre-commit" in await plain_git(attacker, "echo three >> file.txt && git commit -qam three")
    await still_serves(attacker)


async def test_fsmonitor(attacker):
    """core.fsmonitor set to a program (status and diff would run it to list changed files).

    Never run: fsmonitor is switched off per call. Plain git status, as a control, runs it.
    """
    repo = await hostile_repo(attacker, f"core.fsmonitor {attacker.ws}/fsmonitor", programs=("fsmonitor",))
    await every_operation(attacker, repo)
    assert markers(attacker) == []
    assert await plain_git(attacker, "git status") == ["ran-fsmonitor"]
    await still_serves(attacker)


async def test_pager(attacker):
    """core.pager, pager.log, pager.show and pager.diff set to a program.

    Never run: --no-pager on every call, and GIT_PAGER/PAGER are cat.
    """
    repo = await hostile_repo(attacker, f"core.pager {attacker.ws}/pager", f"pager.log {attacker.ws}/pager",
                              f"pager.show {attacker.ws}/pager", f"pager.diff {attacker.ws}/pager",
                              programs=("pager",))
    await every_operation(attacker, repo)
    assert markers(attacker) == []
    await still_serves(attacker)


async def test_ssh_command(attacker):
    """core.sshCommand and an ssh remote (ssh://attacker.example/x), plus url.insteadOf rewriting to it.

    Never run: none of the six operations contacts a remote.
    """
    repo = await hostile_repo(attacker, f"core.sshCommand {attacker.ws}/ssh", "remote.origin.url ssh://attacker.example/x",
                              "remote.origin.fetch +refs/heads/*:refs/remotes/origin/*",
                              "url.ssh://attacker.example/.insteadOf https://", programs=("ssh",))
    await every_operation(attacker, repo)
    assert markers(attacker) == []
    await still_serves(attacker)


async def test_external_programs(attacker):
    """diff.external, a textconv driver, gpg.program with commit.gpgSign, core.editor and core.askPass set to programs.

    Never run: --no-ext-diff, --no-textconv, signing off, and no prompts on every call. Plain git diff and commit, as a control, run the external diff and gpg.
    """
    (attacker.ws / "attributes").write_text("*.txt diff=evil\n")
    repo = await hostile_repo(attacker, f"diff.external {attacker.ws}/external", f"diff.evil.textconv {attacker.ws}/textconv",
                              f"gpg.program {attacker.ws}/gpg", "commit.gpgSign true", f"core.editor {attacker.ws}/editor",
                              f"core.askPass {attacker.ws}/askpass", f"core.attributesFile {attacker.ws}/attributes",
                              programs=("external", "textconv", "gpg", "editor", "askpass"))
    await every_operation(attacker, repo)
    assert markers(attacker) == []
    assert await plain_git(attacker, "echo three >> file.txt && git diff && git commit -qam three") == [
        "ran-external", "ran-gpg"]
    await still_serves(attacker)


FILTER = """#!/bin/sh
# A clean filter from a hostile repository: it runs (the spec allows it) and tries to get out.
report={ws}/filter-report
{{
  echo "uid $(id -u)"
  echo "{canary}" >> /etc/filter-was-here 2>/dev/null && echo "etc writable" || echo "etc refused"
  cat {secret} 2>/dev/null && echo "host secret read" || echo "host secret absent"
  /opt/protolink/bin/python -c "import socket; socket.create_connection(('1.1.1.1', 443), timeout=3)" 2>/dev/null \\
    && echo "network reached" || echo "network refused"
  env | grep -q {canary_variable} && echo "host env seen" || echo "host env absent"
}} > "$report"
touch {ws}/ran-filter
cat
"""


async def test_clean_filter_is_contained(attacker, roots):
    """A clean filter (filter.evil.clean via .gitattributes) that, run by git add and diff, tries to escape: write /etc, read a host file, reach the network, read the host environment.

    The filter does run (the spec says staging clean filters may execute code), as uid 65534 inside the sandbox, and every escape fails.
    """
    program = attacker.ws / "clean"
    program.write_text(FILTER.format(ws=attacker.ws, canary=CANARY, secret=roots.base / "host-secret.txt",
                                     canary_variable="PROTOLINK_SECURITY_CANARY"))
    program.chmod(0o755)
    repo = await hostile_repo(attacker, f"filter.evil.clean {program}", f"filter.evil.smudge {program}",
                              "filter.evil.required true")
    (repo / ".gitattributes").write_text("*.txt filter=evil\n")
    await every_operation(attacker, repo)
    assert markers(attacker) == ["ran-filter"]
    report = (attacker.ws / "filter-report").read_text().splitlines()
    assert report == [f"uid {NOBODY}", "etc refused", "host secret absent", "network refused", "host env absent"]
    await still_serves(attacker)


async def test_malicious_submodule_urls(attacker):
    """A gitlink with .gitmodules URLs ext::sh -c ..., an option-shaped URL (--upload-pack=...) and file:// with options.

    Nothing is fetched or run: none of the six operations updates submodules, and ext:: is not allowed anyway.
    """
    repo = await hostile_repo(attacker)
    (repo / ".gitmodules").write_text(
        f'[submodule "ext"]\n\tpath = ext\n\turl = ext::sh -c touch% {attacker.ws}/ran-ext\n'
        f'[submodule "opt"]\n\tpath = opt\n\turl = --upload-pack=touch {attacker.ws}/ran-upload-pack\n'
        f'[submodule "file"]\n\tpath = file\n\turl = file:///tmp/x --upload-pack=touch%20{attacker.ws}/ran-file\n')
    head = (await attacker.git(repo, "log")).stdout.split()[1]
    setup = await attacker.shell(f"cd repo && for path in ext opt file; do "
                                 f"git update-index --add --cacheinfo 160000,{head},$path; done && "
                                 f"git add .gitmodules && git commit -q -m submodules")
    assert setup.exit_code == 0, setup
    await every_operation(attacker, repo)
    assert markers(attacker) == []
    await still_serves(attacker)


async def test_option_shaped_refs_and_paths(attacker):
    """Refs named like options (refs/heads/--output=FILE, -n1, HEAD pointing at one) and a file named --output=FILE.

    Revisions that look like options are refused before authorization; ref names are never read as options; paths are literal.
    """
    repo = await hostile_repo(attacker)
    option = "--output=ran-output"  # git log would write its output to ./ran-output
    head = (await attacker.git(repo, "log")).stdout.split()[1]
    for ref in (option, "-n1"):
        (repo / ".git" / "refs" / "heads" / ref).write_text(f"{head}\n")
    (repo / ".git" / "HEAD").write_text(f"ref: refs/heads/{option}\n")
    (repo / option).write_text("literal\n")
    for revision in (option, "-n1", "--exec=touch"):
        with pytest.raises(ValueError, match="invalid revision"):
            await attacker.git(repo, "log", revision=revision)
    status = await attacker.git(repo, "status")
    assert option in status.stdout
    await attacker.git(repo, "add", paths=[option])
    staged = await attacker.git(repo, "diff", staged=True)
    assert "+literal" in staged.stdout
    await every_operation(attacker, repo)
    assert markers(attacker) == [] and not (repo / "ran-output").exists()
    await still_serves(attacker)
