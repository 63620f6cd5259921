"""`protolink-sandbox ci` reads its options before `--` and the test command after it."""

from __future__ import annotations

import pytest

from protolink.sandbox.ci.command import split_test
from protolink.sandbox.cli import main


def test_options_after_the_repository_are_the_runners_and_after_dashes_the_tests():
    argv = ["ci", "repo", "--setup", "pip install .", "--", "pytest", "--setup", "-x"]
    assert split_test(argv) == (["ci", "repo", "--setup", "pip install ."], ["pytest", "--setup", "-x"])


@pytest.mark.parametrize("argv, says", [
    (["ci", "/src"], "needs a test command"),
    (["ci", "/src", "--allow", "not a host!", "--", "true"], "not a host!"),
    (["ci", "/src", "--junit", "../x.xml", "--", "true"], "../x.xml"),
    (["ci", "/src", "--env", "PROTOLINK_SURELY_UNSET_VARIABLE", "--", "true"], "PROTOLINK_SURELY_UNSET_VARIABLE"),
])
def test_a_usage_error_exits_2_before_anything_starts(argv, says, capsys):
    assert main(argv) == 2
    assert says in capsys.readouterr().err


def test_the_output_kept_of_each_command_is_an_option():
    from protolink.sandbox.ci.command import job_of
    from protolink.sandbox.cli import _parser

    args = _parser().parse_args(["ci", "/src", "--output-mib", "64"])
    args.test = ["pytest"]
    assert job_of(args).limits.command_output_bytes == 64 << 20
    args = _parser().parse_args(["ci", "/src", "--output-mib", "0"])
    args.test = ["pytest"]
    with pytest.raises(ValueError, match="command_output_bytes"):
        job_of(args)
