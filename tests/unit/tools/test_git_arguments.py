"""Git argument building: exact argv per operation, the option rules, and the environment."""

import pytest

from protolink.tools.builtins.git import (
    DIFF_OPTIONS,
    GLOBAL_OPTIONS,
    check_path,
    check_revision,
    git_arguments,
    git_environment,
)


def command(operation, **options):
    argv = git_arguments(operation, **options)
    assert tuple(argv[:len(GLOBAL_OPTIONS)]) == GLOBAL_OPTIONS
    return argv[len(GLOBAL_OPTIONS):]


def test_global_options_disable_pager_hooks_fsmonitor_signing_and_pathspec_magic():
    assert GLOBAL_OPTIONS[:2] == ("--no-pager", "--literal-pathspecs")
    settings = set(GLOBAL_OPTIONS[3::2])
    assert settings == {"core.hooksPath=/dev/null", "core.fsmonitor=false", "commit.gpgSign=false",
                        "tag.gpgSign=false", "log.showSignature=false"}
    assert DIFF_OPTIONS == ("--no-ext-diff", "--no-textconv")


@pytest.mark.parametrize(("operation", "options", "expected"), [
    ("status", {}, ["status", "--short", "--branch", "--"]),
    ("status", {"paths": ["a b", ":(glob)*"]}, ["status", "--short", "--branch", "--", "a b", ":(glob)*"]),
    ("diff", {}, ["diff", *DIFF_OPTIONS, "--"]),
    ("diff", {"staged": True, "revision": "main~2", "paths": ["x"]},
     ["diff", *DIFF_OPTIONS, "--staged", "--end-of-options", "main~2", "--", "x"]),
    ("log", {}, ["log", *DIFF_OPTIONS, "--max-count=10", "--end-of-options", "HEAD", "--"]),
    ("log", {"max_count": 3, "revision": "a..b"},
     ["log", *DIFF_OPTIONS, "--max-count=3", "--end-of-options", "a..b", "--"]),
    ("show", {}, ["show", *DIFF_OPTIONS, "--end-of-options", "HEAD", "--"]),
    ("show", {"revision": "v1.0^{commit}", "paths": ["-n"]},
     ["show", *DIFF_OPTIONS, "--end-of-options", "v1.0^{commit}", "--", "-n"]),
    ("add", {"paths": ["gone.txt", "-f"]}, ["add", "--all", "--", "gone.txt", "-f"]),
    ("commit", {"message": "-m --amend"}, ["commit", "-m", "-m --amend"]),
])
def test_each_operation_builds_its_exact_command(operation, options, expected):
    assert command(operation, **options) == expected


@pytest.mark.parametrize(("operation", "options", "problem"), [
    ("push", {}, "unsupported git operation"),
    ("status", {"staged": True}, "does not accept staged"),
    ("show", {"max_count": 11}, "does not accept max_count"),
    ("add", {"paths": ["a"], "message": "m"}, "does not accept message"),
    ("commit", {"message": "m", "revision": "HEAD"}, "does not accept revision"),
    ("log", {"revision": "x", "staged": True, "message": "m"}, "does not accept message, staged"),
    ("commit", {"message": "a\0b"}, "NUL"),
])
def test_unsupported_combinations_are_rejected(operation, options, problem):
    with pytest.raises(ValueError, match=problem):
        git_arguments(operation, **options)


@pytest.mark.parametrize("path", ["/abs", "..", "a/../b", "a/..", "", "nul\0"])
def test_paths_must_be_literal_relative_without_parent_components(path):
    with pytest.raises(ValueError):
        check_path(path)


@pytest.mark.parametrize("path", [".", "a/b", "..hidden", "a..b/c", "dir/", "-rf", ":(top)x"])
def test_ordinary_relative_paths_pass_unchanged(path):
    assert check_path(path) == path


@pytest.mark.parametrize("revision", ["HEAD", "HEAD~2", "main^2", "@{-1}", "v1.2.3", "a..b",
                                      "a...b", "feature/x", "0123abcd", "HEAD@{1}", "@"])
def test_revisions_that_pass(revision):
    assert check_revision(revision) == revision


@pytest.mark.parametrize("revision", ["-p", "--output=/tmp/x", ".hidden", "/abs", "HEAD:file",
                                      "a b", "HEAD\n", "", "x" * 300, "ref\0"])
def test_revisions_that_could_be_options_paths_or_odd_are_rejected(revision):
    with pytest.raises(ValueError, match="invalid revision"):
        check_revision(revision)


def test_environment_forces_the_switches_and_drops_overriding_variables():
    env = git_environment({
        "PATH": "/usr/bin", "HOME": "/home/u", "GIT_TERMINAL_PROMPT": "1", "GIT_CONFIG_NOSYSTEM": "0",
        "GIT_CONFIG_PARAMETERS": "'core.hooksPath'='x'", "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "core.fsmonitor", "GIT_CONFIG_VALUE_0": "x", "GIT_EXTERNAL_DIFF": "x",
    })
    assert env == {
        "PATH": "/usr/bin", "HOME": "/home/u",
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "", "SSH_ASKPASS": "", "SSH_ASKPASS_REQUIRE": "never",
        "GIT_OPTIONAL_LOCKS": "0", "GIT_PAGER": "cat", "PAGER": "cat",
    }


def test_factory_resolves_at_registration_and_gates_writes(tmp_path):
    from protolink.tools.builtins import git_tool

    reader = git_tool(cwd=str(tmp_path))
    assert reader.input_schema["properties"]["operation"]["enum"] == ["status", "diff", "log", "show"]
    assert reader.capabilities == ("process.execute", "git.read")
    writer = git_tool(cwd=str(tmp_path), allow_write=True)
    assert writer.input_schema["properties"]["operation"]["enum"][-2:] == ["add", "commit"]
    assert writer.capabilities == ("process.execute", "git.read", "git.write")
    with pytest.raises(ValueError, match="does not exist"):
        git_tool(cwd=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not found"):
        git_tool(cwd=str(tmp_path), executable="git", env={"PATH": str(tmp_path)})
