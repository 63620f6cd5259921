"""A CI job refuses what no job may be, before anything slow happens."""

from __future__ import annotations

import pytest

from protolink.sandbox.ci import CiJob
from protolink.sandbox.ci.job import OutputLimits


def test_a_job_keeps_its_commands_and_rules_as_given():
    job = CiJob(repo="/src", test=["pytest", "-q"], setup=["pip install ."], allow=["pypi.org"],
                junit=["**/junit.xml"], env=["TOKEN"])
    assert job.test == ("pytest", "-q")
    assert job.setup == ("pip install .",)
    assert not job.egress.denies_all


def test_no_allow_rules_mean_no_network():
    assert CiJob(repo="/src", test=["true"]).egress.denies_all


@pytest.mark.parametrize("fields, named", [
    ({"test": []}, "test"),
    ({"test": [""]}, "test"),
    ({"test": ["a\0b"]}, "test"),
    ({"setup": ["  "]}, "setup"),
    ({"setup": "pip install ."}, "setup"),
    ({"allow": ["not a host!"]}, "not a host!"),
    ({"junit": ["/etc/shadow"]}, "/etc/shadow"),
    ({"artifacts": ["../outside/*"]}, "../outside"),
    ({"env": ["A-B"]}, "A-B"),
    ({"timeout_seconds": 0}, "timeout_seconds"),
    ({"timeout_seconds": float("inf")}, "timeout_seconds"),
    ({"repo": ""}, "repo"),
])
def test_a_field_no_job_may_have_is_refused_by_name(fields, named):
    with pytest.raises(ValueError, match=named.replace("?", r"\?")):
        CiJob(**{"repo": "/src", "test": ["true"], **fields})


def test_passed_variables_come_from_the_host_and_must_exist():
    job = CiJob(repo="/src", test=["true"], env=["TOKEN"])
    assert job.environment({"TOKEN": "s3cret", "OTHER": "x"}) == {"TOKEN": "s3cret"}
    with pytest.raises(ValueError, match="TOKEN"):
        job.environment({"OTHER": "x"})


def test_output_limits_must_be_positive_whole_numbers():
    with pytest.raises(ValueError, match="tail_bytes"):
        OutputLimits(tail_bytes=0)
    with pytest.raises(ValueError, match="junit_files"):
        OutputLimits(junit_files=True)
