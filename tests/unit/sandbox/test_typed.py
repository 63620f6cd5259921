"""A command as a person types it: a bare name is looked up in the sandbox, and a failure to
start names the command as it was typed, not the lookup in front of it."""

from __future__ import annotations

from protolink.sandbox.typed import LOOKUP, as_typed, typed_argv


def test_a_bare_name_is_looked_up_in_the_sandbox_and_a_path_runs_as_it_is():
    assert typed_argv(["make", "-j2"]) == [LOOKUP, "--", "make", "-j2"]
    assert typed_argv(["/bin/true"]) == ["/bin/true"]


def test_a_failure_to_start_names_the_command_as_typed():
    failure = f"could not start {LOOKUP!r} in '/no/such': its working directory: No such file or directory"
    assert as_typed(failure, ["make", "-j2"]) == (
        "could not start 'make' in '/no/such': its working directory: No such file or directory")
    path_failure = "could not start '/no/such/file' in '/tmp': No such file or directory"
    assert as_typed(path_failure, ["/no/such/file"]) == path_failure
