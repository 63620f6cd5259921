"""The git tool on a real repository: six operations, their rejections, and no repository code."""

from __future__ import annotations

import os

import pytest
from process_helpers import observed_agent, sh

from protolink import CapabilityPolicy, PolicyDeniedError, ToolArgumentError
from protolink.tools.builtins import git_tool

GIT = "/usr/bin/git"
SETUP = f"""
set -e
{GIT} init -q -b main
{GIT} config user.name Tester
{GIT} config user.email tester@example.invalid
printf 'one\\n' > tracked.txt
printf 'keep\\n' > other.txt
{GIT} add tracked.txt other.txt
{GIT} commit -q -m initial
printf 'two\\n' > tracked.txt
{GIT} add tracked.txt
{GIT} commit -q -m second
"""


@pytest.fixture
async def repo(backend, workspace):
    await sh(backend, workspace, SETUP)
    return workspace


def agent_for(backend, repo, *, allow_write=False, policy=None):
    tool = git_tool(cwd=str(repo), allow_write=allow_write, executable=GIT, backend=backend)
    return observed_agent(tool, policy=policy or CapabilityPolicy())


async def git(observed, operation, **options):
    return await observed.agent.call_tool("git", operation=operation, **options)


async def head(backend, repo) -> str:
    return (await sh(backend, repo, f"{GIT} log -1 --format=%s")).stdout.strip()


async def test_status_is_short_with_branch_and_honors_literal_paths(backend, repo):
    observed = agent_for(backend, repo)
    (repo / "tracked.txt").write_text("three\n")
    (repo / "*.txt").write_text("a file named star\n")
    assert (await git(observed, "status")).stdout == "## main\n M tracked.txt\n?? *.txt\n"
    assert (await git(observed, "status", paths=["*.txt"])).stdout == "## main\n?? *.txt\n"


async def test_diff_of_worktree_index_and_revision(backend, repo):
    observed = agent_for(backend, repo)
    (repo / "tracked.txt").write_text("three\n")
    (repo / "other.txt").write_text("changed\n")
    worktree = await git(observed, "diff", paths=["tracked.txt"])
    assert "+three" in worktree.stdout and "other.txt" not in worktree.stdout
    assert (await git(observed, "diff", staged=True)).stdout == ""
    await sh(backend, repo, f"{GIT} add tracked.txt")
    staged = await git(observed, "diff", staged=True)
    assert "+three" in staged.stdout and "other.txt" not in staged.stdout
    against_first = await git(observed, "diff", revision="HEAD~1", staged=True)
    assert "-one" in against_first.stdout and "+three" in against_first.stdout


async def test_log_counts_and_filters(backend, repo):
    observed = agent_for(backend, repo)
    one = await git(observed, "log", max_count=1)
    assert "second" in one.stdout and "initial" not in one.stdout
    both = await git(observed, "log")
    assert "second" in both.stdout and "initial" in both.stdout
    older = await git(observed, "log", revision="HEAD~1", paths=["other.txt"])
    assert "initial" in older.stdout and "second" not in older.stdout


async def test_show_defaults_to_head_and_accepts_revision_and_paths(backend, repo):
    observed = agent_for(backend, repo)
    latest = await git(observed, "show")
    assert "second" in latest.stdout and "+two" in latest.stdout
    first = await git(observed, "show", revision="HEAD~1", paths=["tracked.txt"])
    assert "initial" in first.stdout and "+one" in first.stdout and "other.txt" not in first.stdout


async def test_nonzero_git_exit_is_a_typed_result(backend, repo):
    result = await git(agent_for(backend, repo), "show", revision="no-such-branch")
    assert result.exit_code == 128 and "no-such-branch" in result.stderr


async def test_add_stages_paths_including_deletions_and_commit_commits_the_index(backend, repo):
    observed = agent_for(backend, repo, allow_write=True)
    (repo / "other.txt").unlink()
    (repo / "new.txt").write_text("new\n")
    (repo / "tracked.txt").write_text("staged earlier\n")
    await sh(backend, repo, f"{GIT} add tracked.txt")
    added = await git(observed, "add", paths=["other.txt", "new.txt"])
    assert added.exit_code == 0
    status = (await git(observed, "status")).stdout
    assert status == "## main\nA  new.txt\nD  other.txt\nM  tracked.txt\n"
    committed = await git(observed, "commit", message="third: add, delete, modify")
    assert committed.exit_code == 0
    assert await head(backend, repo) == "third: add, delete, modify"
    assert (await git(observed, "status")).stdout == "## main\n"


async def test_capabilities_classify_each_call_and_policy_can_refuse_writes(backend, repo):
    observed = agent_for(backend, repo, allow_write=True,
                         policy=CapabilityPolicy({"git.write": "deny"}))
    await git(observed, "status")
    started = observed.of_type("action.requested")[0].data["action"]
    assert started["capabilities"] == ["process.execute", "git.read"]
    (repo / "new.txt").write_text("new\n")
    with pytest.raises(PolicyDeniedError):
        await git(observed, "add", paths=["new.txt"])
    assert observed.of_type("action.requested")[1].data["action"]["capabilities"] == [
        "process.execute", "git.write"]
    assert (await git(observed, "status")).stdout == "## main\n?? new.txt\n"


async def test_write_operations_are_absent_without_allow_write(backend, repo):
    tool = git_tool(cwd=str(repo), executable=GIT, backend=backend)
    assert tool.input_schema["properties"]["operation"]["enum"] == ["status", "diff", "log", "show"]
    assert "git.write" not in tool.capabilities
    observed = observed_agent(tool, policy=CapabilityPolicy())
    with pytest.raises(ToolArgumentError, match="operation"):
        await git(observed, "commit", message="sneaky")
    assert await head(backend, repo) == "second"


@pytest.mark.parametrize(("operation", "options", "problem"), [
    ("status", {"paths": ["/etc/passwd"]}, "absolute"),
    ("diff", {"paths": ["sub/../../outside"]}, r"'\.\.'"),
    ("add", {"paths": [".."]}, r"'\.\.'"),
    ("add", {}, "nonempty list of paths"),
    ("add", {"paths": []}, "nonempty list of paths"),
    ("diff", {"revision": "--output=/tmp/owned"}, "invalid revision"),
    ("log", {"revision": "-p"}, "invalid revision"),
    ("show", {"revision": "HEAD:tracked.txt"}, "invalid revision"),
    ("show", {"revision": "HEAD --stat"}, "invalid revision"),
    ("log", {"staged": True}, "does not accept staged"),
    ("status", {"revision": "HEAD"}, "does not accept revision"),
    ("diff", {"max_count": 3}, "does not accept max_count"),
    ("show", {"message": "x"}, "does not accept message"),
    ("commit", {}, "nonblank message"),
    ("commit", {"message": "  \n "}, "nonblank message"),
    ("commit", {"message": "m", "paths": ["tracked.txt"]}, "does not accept paths"),
])
async def test_invalid_calls_fail_before_authorization(backend, repo, operation, options, problem):
    tool = git_tool(cwd=str(repo), allow_write=True, executable=GIT, backend=backend)
    observed = observed_agent(tool, policy=CapabilityPolicy({"process.execute": "require_approval"}))
    with pytest.raises(ValueError, match=problem):
        await git(observed, operation, **options)
    assert observed.requests == [] and observed.events == []
    assert not (repo.parent / "owned").exists()


async def test_max_count_is_bounded_by_the_schema(backend, repo):
    observed = agent_for(backend, repo)
    with pytest.raises(ToolArgumentError, match="max_count"):
        await git(observed, "log", max_count=101)


async def test_repository_hooks_fsmonitor_and_diff_programs_never_run(backend, repo):
    markers = repo / "markers"
    plant = f"""
set -e
mkdir -p {markers} planted-hooks
for hook in pre-commit prepare-commit-msg commit-msg post-commit post-index-change; do
  for dir in .git/hooks planted-hooks; do
    printf '#!/bin/sh\\ntouch {markers}/%s\\n' "$hook" > "$dir/$hook"
    chmod +x "$dir/$hook"
  done
done
for tool in fsmonitor textconv extdiff gpg pager; do
  printf '#!/bin/sh\\ntouch {markers}/%s\\ncat\\n' "$tool" > "$tool.sh"
  chmod +x "$tool.sh"
done
{GIT} config core.hooksPath "$PWD/planted-hooks"
{GIT} config core.fsmonitor "$PWD/fsmonitor.sh"
{GIT} config diff.evil.textconv "$PWD/textconv.sh"
{GIT} config diff.evil.command "$PWD/extdiff.sh"
{GIT} config diff.external "$PWD/extdiff.sh"
{GIT} config gpg.program "$PWD/gpg.sh"
{GIT} config commit.gpgSign true
{GIT} config log.showSignature true
{GIT} config core.pager "$PWD/pager.sh"
printf '*.txt diff=evil\\n' > .gitattributes
# a signed commit on top, so that showing signatures would call gpg.program
signed=$(printf 'tree %s\\nparent %s\\nauthor T <t@e> 1 +0000\\ncommitter T <t@e> 1 +0000\\n%b\\n\\nsigned\\n' \\
  "$({GIT} write-tree)" "$({GIT} rev-parse HEAD)" \\
  'gpgsig -----BEGIN PGP SIGNATURE-----\\n \\n c2ln\\n -----END PGP SIGNATURE-----' \\
  | {GIT} hash-object -t commit -w --stdin)
{GIT} update-ref HEAD "$signed"
rm -f {markers}/*  # the plain git commands above were free to run what they liked
"""
    await sh(backend, repo, plant)
    observed = agent_for(backend, repo, allow_write=True)
    (repo / "tracked.txt").write_text("changed under hooks\n")
    results = [
        await git(observed, "status"),
        await git(observed, "diff"),
        await git(observed, "add", paths=["tracked.txt", ".gitattributes"]),
        await git(observed, "diff", staged=True),
        await git(observed, "commit", message="hooks must not run"),
        await git(observed, "log", max_count=2),
        await git(observed, "show", revision="HEAD~1"),
    ]
    assert [result.exit_code for result in results] == [0] * len(results), results
    assert sorted(path.name for path in markers.iterdir()) == []
    assert "+changed under hooks" in results[1].stdout  # a plain diff, no textconv or external diff
    assert "hooks must not run" in results[5].stdout and "signed" in results[6].stdout


async def test_preview_and_environment_disable_prompts_config_and_pager(backend, repo):
    tool = git_tool(cwd=str(repo), env={"PATH": "/usr/bin:/bin", "GIT_EXTERNAL_DIFF": "/x",
                                        "GIT_CONFIG_COUNT": "1"},
                    executable=GIT, backend=backend, timeout_seconds=12, max_output_bytes=777)
    observed = observed_agent(tool)
    await git(observed, "log", revision="HEAD~1", paths=["tracked.txt"], max_count=5)
    [request] = observed.requests
    [artifact] = request.artifacts
    content = artifact.content
    assert content["argv"][0] == GIT
    assert content["argv"][-5:] == ["--max-count=5", "--end-of-options", "HEAD~1", "--",
                                    "tracked.txt"]
    assert content["cwd"] == str(repo)
    assert (content["timeout_seconds"], content["max_output_bytes"]) == (12, 777)
    assert content["boundary"] == backend.boundary
    env = content["env"]
    assert "GIT_EXTERNAL_DIFF" not in env and "GIT_CONFIG_COUNT" not in env
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == "/dev/null"
    assert env["GIT_TERMINAL_PROMPT"] == "0" and env["GIT_OPTIONAL_LOCKS"] == "0"
    assert request.action.process == {key: content[key] for key in content if key != "boundary"}


async def test_repository_ownership_check_stays_on_the_host_and_is_off_inside_a_sandbox(backend, repo):
    """On the host Git refuses a repository another user owns; a sandbox's commands run as its
    own unprivileged user, which rarely owns the mounted repository, so there Git works."""
    on_host = backend.boundary == "host"
    owner = 4242 if on_host else 0  # never the uid the commands run as
    for path in [repo, *repo.rglob("*")]:
        os.lchown(path, owner, owner)
    result = await git(agent_for(backend, repo), "status")
    if on_host:
        assert result.exit_code == 128 and "dubious ownership" in result.stderr
    else:
        assert (result.exit_code, result.stdout) == (0, "## main\n")
