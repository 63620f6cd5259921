import pytest

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


@pytest.mark.parametrize("identity", ["os:system", "protolink.tools.builtins.process:process_tool", "protolink.tools.nope:x"])
def test_builtin_identities_cannot_name_arbitrary_callables(identity):
    data = make_agent().to_dict()
    data["tools"] = [{"name": "x", "builtin": identity}]
    with pytest.raises(SerializationError):
        Agent.from_dict(data)


@pytest.mark.parametrize("text", ["- a list", "card: [", "version: 99\ncard: {name: a}"])
def test_malformed_configurations_are_clear_errors(text):
    with pytest.raises(SerializationError):
        Agent.from_yaml(text)
