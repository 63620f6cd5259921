"""The attack corpus as a table: one row per test of tests/security, from the test's docstring.

A corpus test's docstring is two paragraphs: the attack tried, then the outcome the test asserts.
``python -m tests.security.corpus`` prints the Markdown table that SECURITY.md holds between its
``corpus`` markers (``--write`` puts it there); test_security_md.py fails when the two differ.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
SECURITY_MD = HERE.parents[1] / "SECURITY.md"
BEGIN, END = "<!-- corpus:begin -->", "<!-- corpus:end -->"
#: Tests about the corpus itself, not attacks.
NOT_ATTACKS = {"test_security_md.py"}


@dataclass(frozen=True)
class Case:
    """One test of the corpus: its pytest id (without parameters), the attack and the outcome."""

    test_id: str
    attack: str
    outcome: str


def cases() -> list[Case]:
    """Every test function of tests/security/test_*.py, in file order, with its two-paragraph docstring."""
    found = []
    for module in sorted(HERE.glob("test_*.py")):
        if module.name in NOT_ATTACKS:
            continue
        for node in ast.parse(module.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                found.append(_case(f"tests/security/{module.name}::{node.name}", ast.get_docstring(node) or ""))
    return found


def _case(test_id: str, docstring: str) -> Case:
    paragraphs = [" ".join(part.split()) for part in docstring.split("\n\n") if part.strip()]
    if len(paragraphs) != 2:
        raise ValueError(f"{test_id}: the docstring must be two paragraphs (the attack, then the outcome)")
    return Case(test_id, *paragraphs)


def table() -> str:
    """The Markdown table of :func:`cases`, grouped by module."""
    lines = ["| # | Test | Attack | Outcome (asserted) |", "| --- | --- | --- | --- |"]
    for number, case in enumerate(cases(), start=1):
        module, name = case.test_id.removeprefix("tests/security/").split("::")
        cells = (str(number), f"`{module.removesuffix('.py')}::{name}`", case.attack, case.outcome)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def documented_table(text: str) -> str:
    """The table SECURITY.md holds between its corpus markers."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write() -> None:
    """Replace the table in SECURITY.md with the current one."""
    text = SECURITY_MD.read_text()
    head, rest = text.split(BEGIN, 1)
    SECURITY_MD.write_text(f"{head}{BEGIN}\n{table()}\n{END}{rest.split(END, 1)[1]}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(table())
