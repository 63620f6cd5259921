"""calculator(): a small arithmetic grammar with complexity, exponent, magnitude and finiteness limits."""

from __future__ import annotations

import pytest

from protolink import Agent, AgentCard, CapabilityPolicy
from protolink.tools import calculator
from protolink.tools.builtins.calculator import MAX_EXPONENT, MAX_NODES


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("(18 + 6) / 3", 8.0),
        ("2 ** 10", 1024),
        ("2 ** -2", 0.25),
        ("-3 ** 2", -9),
        ("7 // 2", 3),
        ("-7 % 3", 2),
        ("+5 - -5", 10),
        ("1.5 * 4", 6.0),
        ("1_000 + 0x10", 1016),
        ("10 ** 300", 10**300),
        ("(2 ** 0.5) ** 2", 2.0000000000000004),
    ],
)
async def test_arithmetic_results(expression, expected):
    assert await calculator()(expression=expression) == {"expression": expression, "result": expected}


async def test_the_expression_is_trimmed():
    assert await calculator()(expression="  1 + 1\n") == {"expression": "1 + 1", "result": 2}


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("x + 1", "unsupported syntax: Name"),
        ("__import__('os').system('true')", "unsupported syntax: Call"),
        ("(1).real", "unsupported syntax: Attribute"),
        ("abs(-1)", "unsupported syntax: Call"),
        ("True + 1", "unsupported value"),
        ("2j * 2", "unsupported value"),
        ("'a' * 3", "unsupported value"),
        ("1 < 2", "unsupported syntax: Compare"),
        ("1 if 1 else 2", "unsupported syntax"),
        ("[1, 2]", "unsupported syntax: List"),
        ("1 << 4", "unsupported syntax: BinOp"),
        ("~1", "unsupported syntax: UnaryOp"),
        ("(x := 1)", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("1 +", "invalid arithmetic"),
        ("1; 2", "invalid arithmetic"),
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** (1 / 3)", "complex"),
        (f"2 ** {MAX_EXPONENT + 1}", "exponent"),
        ("2 ** 2 ** 2 ** 2 ** 2", "exponent"),
        ("10 ** 301", "magnitude"),
        ("9 ** 999", "magnitude"),
        ("1e300 * 10", "magnitude"),
        ("10 ** 200 * 10 ** 200", "magnitude"),
        ("1.5 ** 1000 * 1e200", "finite"),  # float overflow to inf
        ("1e999", "finite"),
        ("1e999 - 1e999", "finite"),
        ("+".join(["1"] * (MAX_NODES // 2)), "too complex"),
    ],
)
async def test_unsupported_or_unbounded_expressions_are_value_errors(expression, message):
    with pytest.raises(ValueError, match=message):
        await calculator()(expression=expression)


@pytest.mark.parametrize("expression", ["", "   ", "1" * 257])
async def test_the_expression_length_is_bounded(expression):
    with pytest.raises(ValueError, match="expression"):
        await calculator()(expression=expression)


async def test_a_256_character_expression_is_accepted():
    expression = "1" * 256
    assert (await calculator()(expression=expression))["result"] == int(expression)


async def test_the_tool_needs_no_capability_and_serializes_by_identity():
    tool = calculator()
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"),
                  policy=CapabilityPolicy(default_effect="deny"))
    agent.add_tool(tool)

    assert tool.capabilities == () and tool.builtin == "protolink.tools.builtins.calculator:calculator"
    assert (await agent.call_tool("calculator", expression="6 * 7"))["result"] == 42
    assert Agent.from_dict(agent.to_dict()).tools["calculator"].builtin == tool.builtin
