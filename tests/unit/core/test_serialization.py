import inspect

import pytest
import yaml

from protolink import Agent, CapabilityPolicy, SerializationError, ToolNotFoundError
from tests.unit.core.helpers import echo_tool, make_agent


def configured_agent() -> Agent:
    agent = make_agent(policy=CapabilityPolicy({"filesystem.*": "require_approval", "echo.use": "allow"}, default_effect="deny"),
                       max_tool_calls=7, max_run_seconds=30.0)
    agent.add_tool(echo_tool())
    return agent


def test_dict_round_trip_keeps_card_policy_and_limits():
    agent = configured_agent()
    loaded = Agent.from_dict(agent.to_dict())
    assert loaded.card == agent.card
    assert loaded.policy == agent.policy
    assert (loaded.max_tool_calls, loaded.max_run_seconds) == (7, 30.0)
    assert loaded.to_dict() == agent.to_dict()


def test_yaml_round_trip_is_identical():
    agent = configured_agent()
    text = agent.to_yaml()
    assert "echo" in text
    assert Agent.from_yaml(text).to_yaml() == text


async def test_configured_tools_are_named_and_must_be_reattached():
    loaded = Agent.from_dict(configured_agent().to_dict())
    assert loaded.unattached_tools == ("echo",)
    with pytest.raises(ToolNotFoundError, match="register its factory again"):
        await loaded.call_tool("echo", text="x")
    loaded.add_tool(echo_tool())
    assert loaded.unattached_tools == ()
    assert await loaded.call_tool("echo", text="x") == {"text": "x"}


def test_tools_can_be_supplied_while_loading():
    loaded = Agent.from_dict(configured_agent().to_dict(), tools=[echo_tool()])
    assert loaded.unattached_tools == ()
    assert "echo" in loaded.tools


async def test_live_counters_are_not_serialized():
    agent = configured_agent()
    before = agent.to_dict()
    run = agent.new_run()
    await agent.call_tool("echo", context=run, text="x")
    assert run.tool_calls == 1
    assert agent.to_dict() == before


def test_custom_policy_must_be_supplied_when_loading():
    class OnlyReads:
        def evaluate(self, capabilities):
            return "allow" if all(c.endswith(".read") for c in capabilities) else "deny"

    data = make_agent(policy=OnlyReads()).to_dict()
    assert data["policy"] == {"type": "custom", "class": "test_custom_policy_must_be_supplied_when_loading.<locals>.OnlyReads"}
    with pytest.raises(SerializationError, match="pass policy="):
        Agent.from_dict(data)
    assert isinstance(Agent.from_dict(data, policy=OnlyReads()).policy, OnlyReads)


@pytest.mark.parametrize("identity", ["os:system", "protolink.tools.builtins.process:process_tool",
                                      "protolink.tools.nope:x", "protolink.tools.builtins:filesystem_tools",
                                      "protolink.tools.builtins.filesystem:filesystem_tools"])
def test_builtin_identities_cannot_name_arbitrary_callables(identity):
    data = make_agent().to_dict()
    data["tools"] = [{"name": "x", "builtin": identity}]
    with pytest.raises(SerializationError):
        Agent.from_dict(data)


@pytest.mark.parametrize("text", ["- a list", "card: [", "version: 99\ncard: {name: a}",
                                  "version: true\ncard: {name: a}", "[" * 2000 + "]" * 2000,
                                  "version: 1\ncard: {name: a}\nlimits: {max_tool_calls: " + "1" * 5000 + "}",
                                  "version: 1\ncard: {name: a}\nsystem_prompt: 2024-02-30",
                                  "version: 1\ncard: {name: a}\nsystem_prompt: !!timestamp x",
                                  "version: 1\ncard: !!python/object/apply:os.system [echo]"])
def test_malformed_configurations_are_clear_errors(text):
    with pytest.raises(SerializationError):
        Agent.from_yaml(text)


def test_a_builtin_factory_is_not_called_unless_its_identity_is_known(monkeypatch):
    import protolink.tools.builtins.process as process

    calls = []
    monkeypatch.setattr(process, "process_tool", lambda: calls.append("called"))
    data = make_agent().to_dict()
    data["tools"] = [{"name": "process", "builtin": "protolink.tools.builtins.process:process_tool"}]
    with pytest.raises(SerializationError, match="not a parameterless built-in tool"):
        Agent.from_dict(data)
    assert calls == []


def test_every_parameterless_builtin_tool_loads_by_its_identity():
    from protolink.tools import builtins

    factories = [getattr(builtins, name) for name in builtins.__all__]
    agent = make_agent()
    for factory in factories:
        if inspect.isfunction(factory) and not inspect.signature(factory).parameters:
            agent.add_tool(factory())
    assert "calculator" in agent.tools
    assert Agent.from_dict(agent.to_dict()).to_dict() == agent.to_dict()


def billion_laughs(depth: int) -> str:
    """A few hundred bytes whose aliases expand to 9 ** depth strings in ``card.skills``."""
    lines = ["version: 1", "l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, depth)]
    return "\n".join([*lines, f"card: {{name: a, skills: *l{depth - 1}}}"])


@pytest.mark.parametrize("text", [billion_laughs(7), "version: 1\ncard: &card {name: a}",
                                  "version: 1\nbase: &base {name: a}\ncard: {<<: *base}"])
def test_yaml_anchors_and_aliases_are_refused(text):
    with pytest.raises(SerializationError, match=r"anchors and aliases \(&, \*\) are not allowed .*line \d+, column"):
        Agent.from_yaml(text)


def test_a_large_invalid_card_gives_a_short_message():
    skills = ", ".join(["{a: 1}"] * 2000)
    with pytest.raises(SerializationError) as raised:
        Agent.from_yaml(f"version: 1\ncard:\n  name: a\n  skills: [{skills}]\n  ? {'x' * 100_000}\n  : 1\n")
    assert str(raised.value).startswith("invalid agent card: skills.0: Input should be a valid string; skills.1: ")
    assert str(raised.value).endswith("(and 1998 more)") and len(str(raised.value)) < 400


def test_shared_references_in_a_dict_give_a_short_message():
    skills = ["lol"] * 9
    for _ in range(6):
        skills = [skills] * 9
    with pytest.raises(SerializationError, match=r"skills\.0: Input should be a valid string") as raised:
        Agent.from_dict({"version": 1, "card": {"name": "a", "skills": skills}})
    assert len(str(raised.value)) < 400


def from_yaml_text(text: str) -> Agent:
    return Agent.from_yaml(text)


def from_parsed_dict(text: str) -> Agent:
    return Agent.from_dict(yaml.safe_load(text))


@pytest.mark.parametrize("load", [from_yaml_text, from_parsed_dict])
@pytest.mark.parametrize(("text", "message"), [
    ("polcy: {}", "configuration has an unknown key 'polcy'"),
    ("policy: [1, 2]", "policy must be a mapping, not list"),
    ("policy: {rules: [1]}", "policy.rules must be a mapping"),
    ("policy: {rules: {'a*b': allow}}", "invalid policy: invalid capability pattern 'a\\*b'"),
    ("policy: {rules: {a: maybe}}", "invalid policy: rule 'a': effect must be one of"),
    ("limits: [1]", "limits must be a mapping, not list"),
    ("limits: {max_tool_call: 5}", "limits has an unknown key 'max_tool_call'"),
    ("limits: {max_tool_calls: lots}", "limits.max_tool_calls must be an integer >= 0 or null, not 'lots'"),
    ("limits: {max_tool_calls: -1}", "limits.max_tool_calls must be an integer >= 0"),
    ("limits: {max_tool_calls: 2.5}", "limits.max_tool_calls must be an integer >= 0"),
    ("limits: {max_tool_calls: true}", "limits.max_tool_calls must be an integer >= 0"),
    ("limits: {max_run_seconds: .nan}", "limits.max_run_seconds must be a finite number > 0 or null, not nan"),
    ("limits: {max_run_seconds: .inf}", "limits.max_run_seconds must be a finite number > 0"),
    ("limits: {max_run_seconds: 0}", "limits.max_run_seconds must be a finite number > 0"),
    ("limits: {max_run_seconds: soon}", "limits.max_run_seconds must be a finite number > 0"),
    ("limits: {max_steps: null}", "limits.max_steps must be an integer >= 0, not None"),
    ("system_prompt: [hi]", "system_prompt must be a string or null"),
    ("tools: calculator", "tools must be a list, not str"),
    ("tools: [calculator]", r"tools\[0\] must be a mapping, not str"),
    ("tools: [{builtin: 'protolink.tools.builtins.calculator:calculator'}]", r"tools\[0\]\.name must be"),
    ("tools: [{name: x, builtin: 5}]", r"tools\[0\]\.builtin must be a string"),
    ("tools: [{name: echo}, {name: echo}]", r"tools\[1\]: the tool 'echo' is listed twice"),
    ("tools: [{name: x, builtin: 'protolink.tools.builtins.calculator:calculator'}, "
     "{name: calculator, builtin: 'protolink.tools.builtins.calculator:calculator'}]",
     r"tools\[0\]: protolink.tools.builtins.calculator:calculator makes a tool named 'calculator', not 'x'"),
])
def test_malformed_fields_are_serialization_errors_naming_them(load, text, message):
    with pytest.raises(SerializationError, match=message):
        load(f"version: 1\ncard: {{name: a}}\n{text}")


@pytest.mark.parametrize("load", [from_yaml_text, from_parsed_dict])
def test_null_sections_mean_their_defaults_and_every_accepted_limit_loads(load):
    loaded = load("version: 1\ncard: {name: a}\npolicy: null\ntools: null\nsystem_prompt: null\nlimits: null")
    assert (loaded.policy, loaded.tools, loaded.max_tool_calls, loaded.max_run_seconds, loaded.max_steps) == (
        CapabilityPolicy(), {}, None, None, 20)
    loaded = load("version: 1\ncard: {name: a}\nlimits: {max_tool_calls: 0, max_run_seconds: 30, max_steps: 0}")
    assert (loaded.max_tool_calls, loaded.max_run_seconds, loaded.max_steps) == (0, 30, 0)
    assert loaded.new_run().max_seconds == 30
