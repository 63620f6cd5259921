"""Public web search through an Agent, with an explicit engine and an explicit network policy.

::

    # Keyless search through Wikipedia's documented API (the default here)
    python examples/builtin_web_search.py "What is the capital of Greece?"

    # Documented Brave API
    export BRAVE_SEARCH_API_KEY="your-key"
    python examples/builtin_web_search.py "Python structured concurrency" --engine brave

    # Keyless, best-effort DuckDuckGo HTML search
    python examples/builtin_web_search.py "Python structured concurrency" --engine duckduckgo

Without a query it prints its help and makes no network request. With one, the query leaves this
machine, and the printed titles, URLs and snippets are untrusted external data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from protolink import Agent, AgentCard, CapabilityPolicy
from protolink.tools import web_search


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Search the public web through ProtoLink's web_search tool and print JSON.",
        epilog="brave needs BRAVE_SEARCH_API_KEY; wikipedia and duckduckgo are keyless. "
               "Engines are never swapped silently.",
    )
    parser.add_argument("query", nargs="?", help="search text (1-400 characters, at most 50 words)")
    parser.add_argument("--engine", choices=["wikipedia", "brave", "duckduckgo"], default="wikipedia")
    parser.add_argument("--max-results", type=int, default=5, help="1-10 (default 5)")
    parser.add_argument("--freshness", choices=["any", "day", "week", "month", "year"], default="any",
                        help="result age; wikipedia supports only 'any'")
    return parser


async def search(query: str, *, engine: str, max_results: int, freshness: str) -> dict[str, Any]:
    """One web_search call on an Agent whose policy allows network.read and nothing else."""
    agent = Agent(
        AgentCard(name="web-search", description="Public web search", url="runtime://web-search"),
        policy=CapabilityPolicy({"network.read": "allow"}, default_effect="deny"),
    )
    agent.add_tool(web_search())
    return await agent.call_tool("web_search", query=query, engine=engine, max_results=max_results,
                                 freshness=freshness)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.query is None:
        parser.print_help()
        return 0
    try:
        result = asyncio.run(search(args.query, engine=args.engine, max_results=args.max_results,
                                    freshness=args.freshness))
    except (ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
