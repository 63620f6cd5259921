"""calculator: a small arithmetic grammar evaluated from its syntax tree, never with eval.

Grammar: int and float literals, parentheses, unary ``+``/``-`` and the binary operators
``+ - * / // % **``. Names, attributes, calls, comparisons, booleans, strings and complex values
are rejected. Evaluation is bounded: at most ``MAX_NODES`` syntax-tree nodes, exponents up to
``MAX_EXPONENT`` in magnitude, every intermediate value within ``MAX_MAGNITUDE``, finite results.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from protolink.core.tools import Tool, ToolContext

MAX_EXPRESSION_CHARS = 256
MAX_NODES = 200
MAX_EXPONENT = 1_000
MAX_MAGNITUDE = 1e300

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "expression": {"type": "string", "maxLength": MAX_EXPRESSION_CHARS},
        "result": {"type": "number"},
    },
    "required": ["expression", "result"],
    "additionalProperties": False,
}


class CalculatorArguments(BaseModel):
    """Arguments of ``calculator``."""

    model_config = ConfigDict(extra="forbid")

    expression: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_EXPRESSION_CHARS)
    ] = Field(description="Arithmetic with numbers, parentheses, unary signs and + - * / // % **")


def calculator() -> Tool:
    """A fresh pure arithmetic tool; needs no capability.

    Returns ``{"expression": <trimmed>, "result": <int or float>}``. Invalid or unsupported
    syntax, division by zero, oversized powers or values, excessive complexity and non-finite
    results raise ValueError.
    """
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression: numbers, parentheses, + - * / // % and **.",
        arguments=CalculatorArguments,
        handler=_calculate,
        tags=("builtin", "math", "read-only"),
        output_schema=OUTPUT_SCHEMA,
        builtin="protolink.tools.builtins.calculator:calculator",
    )


async def _calculate(args: CalculatorArguments, context: ToolContext) -> dict[str, Any]:
    return {"expression": args.expression, "result": evaluate(args.expression)}


def evaluate(expression: str) -> Number:
    """The value of an arithmetic expression under the calculator's grammar and limits."""
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError) as error:
        raise ValueError(f"invalid arithmetic: {getattr(error, 'msg', error)}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise ValueError(f"expression is too complex: {nodes} syntax-tree nodes (limit {MAX_NODES})")
    return _evaluate(tree.body)


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):
            raise ValueError(f"unsupported value {node.value!r}: only int and float numbers")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError(f"result exceeds the magnitude limit {MAX_MAGNITUDE:g}") from None
        return _bounded(value)
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def _check_power(base: Number, exponent: Number) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} exceeds the limit {MAX_EXPONENT}")
    if base < 0 and not float(exponent).is_integer():
        raise ValueError("fractional power of a negative number is complex, which is unsupported")
    if base == 0 and exponent < 0:
        raise ValueError("division by zero")
    # Refuse before computing: |base| ** exponent must stay within the magnitude limit.
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_MAGNITUDE):
        raise ValueError(f"result exceeds the magnitude limit {MAX_MAGNITUDE:g}")


def _bounded(value: Any) -> Number:
    if isinstance(value, complex):
        raise ValueError("complex results are unsupported")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"result exceeds the magnitude limit {MAX_MAGNITUDE:g}")
    return value
