import pytest

from protolink import CapabilityPolicy


def test_default_effect_is_allow():
    assert CapabilityPolicy().evaluate(["filesystem.write"]) == "allow"


@pytest.mark.parametrize("effect", ["allow", "deny", "require_approval"])
def test_exact_rule_gives_its_effect(effect):
    policy = CapabilityPolicy({"process.execute": effect}, default_effect="deny")
    assert policy.evaluate(["process.execute"]) == effect


def test_unmatched_capability_takes_default_effect():
    policy = CapabilityPolicy({"filesystem.read": "allow"}, default_effect="deny")
    assert policy.evaluate(["network.read"]) == "deny"


def test_wildcard_matches_family_and_exact_rule_is_more_specific():
    policy = CapabilityPolicy({"filesystem.*": "require_approval", "filesystem.read": "allow"},
                              default_effect="deny")
    assert policy.evaluate(["filesystem.read"]) == "allow"
    assert policy.evaluate(["filesystem.write"]) == "require_approval"
    assert policy.evaluate(["filesystemx.write"]) == "deny"


def test_longest_wildcard_prefix_wins_and_star_matches_everything():
    policy = CapabilityPolicy({"*": "deny", "a.*": "require_approval", "a.b.*": "allow"})
    assert policy.evaluate(["a.b.c"]) == "allow"
    assert policy.evaluate(["a.x"]) == "require_approval"
    assert policy.evaluate(["z"]) == "deny"


def test_strictest_effect_wins_across_capabilities():
    policy = CapabilityPolicy({"process.execute": "allow", "git.write": "require_approval",
                               "shell.execute": "deny"})
    assert policy.evaluate(["process.execute", "git.write"]) == "require_approval"
    assert policy.evaluate(["process.execute", "git.write", "shell.execute"]) == "deny"


def test_no_capabilities_is_allowed_even_with_deny_default():
    assert CapabilityPolicy(default_effect="deny").evaluate([]) == "allow"


@pytest.mark.parametrize("rules", [{"x": "maybe"}, {"a*": "allow"}, {"*.a": "allow"}, {"": "allow"}])
def test_invalid_rules_are_rejected(rules):
    with pytest.raises(ValueError):
        CapabilityPolicy(rules)


def test_invalid_default_effect_is_rejected():
    with pytest.raises(ValueError, match="default_effect"):
        CapabilityPolicy(default_effect="sometimes")


def test_round_trip_through_dict():
    policy = CapabilityPolicy({"filesystem.*": "require_approval"}, default_effect="deny")
    assert CapabilityPolicy.from_dict(policy.to_dict()) == policy
