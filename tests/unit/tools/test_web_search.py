"""web_search(): three explicit engines, one normalized contract, recorded provider responses.

Provider answers are recorded fixtures (tests/fixtures/web/) served over real HTTP/1.1 by a local
site; the scripted network stands in for DNS, so every endpoint check and pinned connection is
observable.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from protolink import Agent, AgentCard, CapabilityPolicy
from protolink.core.runs import RunContext
from protolink.errors import BudgetExceededError, PolicyDeniedError
from protolink.tools import web_search
from protolink.tools.builtins import web
from protolink.net.network import use_network
from tests.unit.tools.web_support import Reply, ScriptedNetwork, Site, fixture

BRAVE = ("api.search.brave.com", "/res/v1/web/search")
DUCKDUCKGO = ("html.duckduckgo.com", "/html/")
WIKIPEDIA = ("en.wikipedia.org", "/w/rest.php/v1/search/page")
PUBLIC_DNS = {
    "api.search.brave.com": [["151.101.2.217"]],
    "html.duckduckgo.com": [["52.142.124.215"]],
    "en.wikipedia.org": [["208.80.154.224", "2620:0:861:ed1a::1"]],
}
pytestmark = pytest.mark.asyncio(loop_scope="session")  # the same loop as the async site fixture
JSON = [("Content-Type", "application/json; charset=utf-8")]
HTML = [("Content-Type", "text/html; charset=UTF-8")]


@pytest.fixture
async def site():
    async with Site() as site:
        yield site


@pytest.fixture
def network(site: Site):
    with use_network(ScriptedNetwork(site, {host: [list(a) for a in answers] for host, answers in PUBLIC_DNS.items()})) as net:
        yield net


@pytest.fixture
def brave_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", "BSA-test-key-123")
    return "BSA-test-key-123"


def query_of(site: Site) -> dict[str, list[str]]:
    return parse_qs(urlsplit(site.requests[-1].target).query)


# -- Brave -----------------------------------------------------------------------------------


async def test_brave_is_the_default_and_results_are_normalized(site, network, brave_key):
    site.route(*BRAVE, Reply(200, JSON, fixture("brave_web_search.json")))

    result = await web_search()(query="  Python 3.14 release notes  ", max_results=2, freshness="week")

    assert result["query"] == "Python 3.14 release notes"
    assert result["provider"] == "brave"
    assert result["untrusted_content"] is True
    assert result["more_results_available"] is True
    assert result["results"] == [
        {
            "title": "What’s New In Python 3.14 — Python 3.14.0 documentation",
            "url": "https://docs.python.org/3/whatsnew/3.14.html",
            "snippet": "This article explains the new features in Python 3.14, compared to 3.13. Python 3.14 was "
                       "released on 7 October 2025. For full details, see the changelog.",
            "sponsored": False,
        },
        {
            "title": "Python Release Python 3.14.0 | Python.org",
            "url": "https://www.python.org/downloads/release/python-3140/",
            "snippet": "The official home of the Python Programming Language. Python 3.14.0 is the newest major "
                       "release & contains many new features and optimizations.",
            "sponsored": False,
        },
    ]
    request = site.requests[-1]
    assert request.headers["x-subscription-token"] == brave_key
    assert query_of(site) == {"q": ["Python 3.14 release notes"], "count": ["2"], "freshness": ["pw"]}


async def test_the_brave_key_is_read_only_when_invoked(site, network, monkeypatch):
    monkeypatch.delenv("BRAVE_SEARCH_API_KEY", raising=False)
    tool = web_search()  # no key yet: creating and registering the tool needs none
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"))
    agent.add_tool(tool)
    monkeypatch.setenv("BRAVE_SEARCH_API_KEY", "key-set-later")
    site.route(*BRAVE, Reply(200, JSON, fixture("brave_web_search.json")))

    await agent.call_tool("web_search", query="python")

    assert site.requests[-1].headers["x-subscription-token"] == "key-set-later"
    assert "key-set-later" not in json.dumps(agent.to_dict())


async def test_a_missing_brave_key_is_a_value_error_and_nothing_is_sent(site, network, monkeypatch):
    monkeypatch.delenv("BRAVE_SEARCH_API_KEY", raising=False)

    with pytest.raises(ValueError, match="BRAVE_SEARCH_API_KEY"):
        await web_search()(query="python")

    assert network.lookups == [] and site.requests == []


@pytest.mark.parametrize(("status", "message"), [(401, "rejected the API key"), (429, "rate-limited"), (500, "HTTP 500")])
async def test_brave_http_failures_are_runtime_errors(site, network, brave_key, status, message):
    site.route(*BRAVE, Reply(status, JSON, b'{"type":"ErrorResponse"}'))

    with pytest.raises(RuntimeError, match=message):
        await web_search()(query="python")


async def test_a_redirect_is_an_error_and_is_not_followed(site, network, brave_key):
    site.route(*BRAVE, Reply(302, [("Location", "https://evil.example/")]))

    with pytest.raises(RuntimeError, match="redirect"):
        await web_search()(query="python")

    assert len(site.requests) == 1 and network.lookups == ["api.search.brave.com"]


async def test_brave_titles_are_plain_text_as_its_snippets_are(site, network, brave_key):
    body = {"web": {"results": [{"title": "Fish <strong>&amp;</strong> chips", "url": "https://example.org/",
                                 "description": "<strong>Fresh</strong> &amp; hot"}]}}
    site.route(*BRAVE, Reply(200, JSON, json.dumps(body).encode()))

    result = await web_search()(query="fish")

    assert [(r["title"], r["snippet"]) for r in result["results"]] == [("Fish & chips", "Fresh & hot")]


async def test_malformed_provider_json_is_a_runtime_error(site, network, brave_key):
    site.route(*BRAVE, Reply(200, JSON, b'{"web": {"results": [{"title": 1}]}}'))

    with pytest.raises(RuntimeError, match="unexpected shape"):
        await web_search()(query="python")


# -- DuckDuckGo ------------------------------------------------------------------------------


async def test_duckduckgo_keeps_ads_in_provider_order_marked_sponsored(site, network, monkeypatch):
    monkeypatch.delenv("BRAVE_SEARCH_API_KEY", raising=False)
    site.route(*DUCKDUCKGO, Reply(200, HTML, fixture("duckduckgo_results.html"), framing="chunked"))

    result = await web_search()(query="Python structured concurrency", engine="duckduckgo",
                                freshness="month", max_results=10)

    assert result["provider"] == "duckduckgo"
    assert [(r["sponsored"], r["url"]) for r in result["results"]] == [
        (True, "https://duckduckgo.com/y.js?ad_domain=learnpython.example&ad_provider=bingv7aa&ad_type=txad"
               "&eddgt=Qk9e2kP8y5c3mXHn0wUeVg%3D%3D&rut=7b1d4a2e9f0c&u3=https%3A%2F%2Fwww.bing.com%2Faclick%3Fld%3D"
               "e8kzQd%26u%3DaHR0cHM6Ly9sZWFybnB5dGhvbi5leGFtcGxlLw%26rlid%3D5b0f&vqd=4-112233445566778899"
               "&iurl=%7B1%7DIG%3D0A1B2C"),
        (False, "https://vorpus.org/blog/notes-on-structured-concurrency-or-go-statement-considered-harmful/"),
        (False, "https://docs.python.org/3/library/asyncio-task.html#task-groups"),
        (True, "https://duckduckgo.com/y.js?ad_domain=cloudide.example&ad_provider=bingv7aa&ad_type=txad"
               "&eddgt=Zx9%2Fq0Wv&rut=1a2b3c&u3=https%3A%2F%2Fwww.bing.com%2Faclick%3Fld%3De8Q2"
               "&vqd=4-112233445566778899"),
        (False, "https://trio.readthedocs.io/en/stable/reference-core.html"),
        (False, "https://en.wikipedia.org/wiki/Structured_concurrency"),
    ]
    first_organic = result["results"][1]
    assert first_organic["title"] == "Notes on structured concurrency, or: Go statement considered harmful"
    assert first_organic["snippet"] == (
        "Every concurrency API needs a way to run code concurrently. Here's what that looks like in "
        "Trio's nursery design, and why it matters."
    )
    assert result["results"][0]["title"] == "Learn Python Concurrency - Hands-On Async Course"
    assert result["more_results_available"] is True  # the page offers a next page
    assert query_of(site) == {"q": ["Python structured concurrency"], "df": ["m"]}
    assert "mozilla" not in site.requests[-1].headers["user-agent"].lower()  # no browser spoofing


async def test_duckduckgo_result_count_is_bounded(site, network):
    site.route(*DUCKDUCKGO, Reply(200, HTML, fixture("duckduckgo_results.html")))

    result = await web_search()(query="Python structured concurrency", engine="duckduckgo", max_results=2)

    assert [r["sponsored"] for r in result["results"]] == [True, False]
    assert result["more_results_available"] is True


@pytest.mark.parametrize("status", [202, 200])
async def test_a_duckduckgo_challenge_points_to_wikipedia(site, network, status):
    site.route(*DUCKDUCKGO, Reply(status, HTML, fixture("duckduckgo_challenge.html")))

    with pytest.raises(RuntimeError, match="challenge.*engine='wikipedia'"):
        await web_search()(query="Python structured concurrency", engine="duckduckgo")

    assert len(site.requests) == 1  # no retry, no bypass attempt


async def test_duckduckgo_with_no_results_is_an_empty_list(site, network):
    site.route(*DUCKDUCKGO, Reply(200, HTML, fixture("duckduckgo_no_results.html")))

    result = await web_search()(query="qzxjvkwpfhtbnmlrgdsy", engine="duckduckgo")

    assert result["results"] == [] and result["more_results_available"] is False


async def test_an_unrecognized_duckduckgo_page_is_an_error_not_zero_results(site, network):
    site.route(*DUCKDUCKGO, Reply(200, HTML, b"<html><body><p>Something else entirely</p></body></html>"))

    with pytest.raises(RuntimeError, match="does not recognize"):
        await web_search()(query="python", engine="duckduckgo")


@pytest.mark.parametrize("target", ["javascript%3Aalert(1)", "https%3A%2F%2Fuser%3Apw%40example.com%2F", ""])
async def test_duckduckgo_redirect_targets_are_validated(site, network, target):
    page = (
        '<div id="links"><div class="result results_links web-result">'
        f'<a class="result__a" href="//duckduckgo.com/l/?uddg={target}&amp;rut=1">Title</a>'
        '<a class="result__snippet">Snippet</a></div></div>'
    )
    site.route(*DUCKDUCKGO, Reply(200, HTML, page.encode()))

    with pytest.raises(RuntimeError, match="DuckDuckGo returned"):
        await web_search()(query="python", engine="duckduckgo")


# -- Wikipedia -------------------------------------------------------------------------------


async def test_wikipedia_excerpts_become_plain_text(site, network):
    site.route(*WIKIPEDIA, Reply(200, JSON, fixture("wikipedia_search_page.json")))

    result = await web_search()(query="What is the capital of Greece?", engine="wikipedia", max_results=3)

    assert result["provider"] == "wikipedia"
    assert result["results"] == [
        {
            "title": "Athens",
            "url": "https://en.wikipedia.org/wiki/Athens",
            "snippet": "Athens is the capital and largest city of Greece. A significant coastal urban area in the "
                       "Mediterranean, Athens is also the capital of the Attica region",
            "sponsored": False,
        },
        {
            "title": "List of capitals of Greece",
            "url": "https://en.wikipedia.org/wiki/List_of_capitals_of_Greece",
            "snippet": "This is a list of capitals of Greece since 1821: Nafplio & Aegina (1828–1834) and Athens "
                       "(since 1834).",
            "sponsored": False,
        },
        {
            "title": "Greece",
            "url": "https://en.wikipedia.org/wiki/Greece",
            "snippet": "Greece, officially the Hellenic Republic, is a country in Southeast Europe. Its capital "
                       "and largest city is Athens",
            "sponsored": False,
        },
    ]
    assert result["more_results_available"] is True
    assert query_of(site) == {"q": ["What is the capital of Greece?"], "limit": ["4"]}


async def test_wikipedia_reports_when_no_more_results_exist(site, network):
    site.route(*WIKIPEDIA, Reply(200, JSON, fixture("wikipedia_search_page.json")))

    result = await web_search()(query="capital of Greece", engine="wikipedia", max_results=10)

    assert len(result["results"]) == 6 and result["more_results_available"] is False
    assert result["results"][-1]["snippet"] == "Civilization belonging to an early period of Greek history"


@pytest.mark.parametrize("freshness", ["day", "week", "month", "year"])
async def test_wikipedia_accepts_only_any_freshness(site, network, freshness):
    with pytest.raises(ValueError, match="freshness"):
        await web_search()(query="Athens", engine="wikipedia", freshness=freshness)

    assert network.lookups == []


# -- limits and transport --------------------------------------------------------------------


@pytest.mark.parametrize(
    "arguments",
    [
        {"query": ""},
        {"query": "   \n\t "},
        {"query": "x" * 401},
        {"query": " ".join(["word"] * 51)},
        {"query": "python", "max_results": 0},
        {"query": "python", "max_results": 11},
        {"query": "python", "freshness": "decade"},
        {"query": "python", "engine": "google"},
        {"query": "python", "headers": {"X": "1"}},
    ],
)
async def test_invalid_arguments_raise_value_error_before_any_request(site, network, arguments):
    with pytest.raises(ValueError):
        await web_search()(**arguments)

    assert network.lookups == []


async def test_query_limits_apply_after_stripping(site, network):
    site.route(*WIKIPEDIA, Reply(200, JSON, b'{"pages": []}'))

    result = await web_search()(query="  " + "x" * 400 + "  ", engine="wikipedia")
    assert result["query"] == "x" * 400
    result = await web_search()(query=" ".join(["w"] * 50), engine="wikipedia")
    assert result["results"] == []


async def test_endpoints_are_fixed_https_and_connections_pinned_to_validated_addresses(site, network):
    site.route(*WIKIPEDIA, Reply(200, JSON, b'{"pages": []}'))

    await web_search()(query="Athens", engine="wikipedia")

    assert network.lookups == ["en.wikipedia.org"]
    assert network.connections == [("208.80.154.224", 443, "en.wikipedia.org")]
    assert site.requests[-1].headers["host"] == "en.wikipedia.org"


@pytest.mark.parametrize("answers", [["10.0.0.7"], ["208.80.154.224", "127.0.0.1"], ["169.254.169.254"]])
async def test_an_endpoint_resolving_to_a_non_public_address_is_refused(site, network, answers):
    network.dns["en.wikipedia.org"] = [answers]

    with pytest.raises(RuntimeError, match="not a public destination"):
        await web_search()(query="Athens", engine="wikipedia")

    assert network.connections == [] and site.requests == []


async def test_a_response_over_two_million_bytes_is_refused(site, network):
    site.route(*WIKIPEDIA, Reply(200, JSON, b" " * (web.MAX_RESPONSE_BYTES + 1)))

    with pytest.raises(RuntimeError, match="larger than 2000000 bytes"):
        await web_search()(query="Athens", engine="wikipedia")


async def test_an_endless_response_stops_being_read_past_the_limit(site, network):
    async def endless():
        while True:
            yield b"x" * 65536

    site.route(*WIKIPEDIA, Reply(200, JSON, framing="close", body_stream=endless))

    with pytest.raises(RuntimeError, match="larger than 2000000 bytes"):
        await asyncio.wait_for(web_search()(query="Athens", engine="wikipedia"), 60)


async def test_the_transport_deadline_bounds_a_silent_provider(site, network, monkeypatch):
    monkeypatch.setattr(web, "TRANSPORT_SECONDS", 0.2)
    site.route(*WIKIPEDIA, Reply(stall=True))

    with pytest.raises(RuntimeError, match="timed out after 0.2 seconds"):
        await web_search()(query="Athens", engine="wikipedia")
    await asyncio.wait_for(site.closed.wait(), 30)  # the connection was closed


async def test_the_run_budget_bounds_the_request_too(site, network):
    site.route(*WIKIPEDIA, Reply(stall=True))
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"))
    agent.add_tool(web_search())

    with pytest.raises(BudgetExceededError):
        await agent.call_tool("web_search", context=RunContext(max_seconds=0.3), query="Athens", engine="wikipedia")


# -- the tool itself ---------------------------------------------------------------------------


async def test_the_tool_is_a_plain_network_read_builtin():
    tool = web_search()

    assert tool.name == "web_search"
    assert tool.capabilities == ("network.read",)
    assert {"builtin", "web", "search", "read-only"} <= set(tool.tags)
    assert tool.builtin == "protolink.tools.builtins.web:web_search"
    assert tool.output_schema["properties"]["results"]["maxItems"] == 10
    assert tool.input_schema["properties"]["engine"]["enum"] == ["brave", "duckduckgo", "wikipedia"]


async def test_registration_serializes_by_identity_and_policy_applies(site, network):
    agent = Agent(AgentCard(name="a", description="d", url="runtime://a"),
                  policy=CapabilityPolicy({"network.read": "deny"}, default_effect="allow"))
    agent.add_tool(web_search())

    restored = Agent.from_dict(agent.to_dict())
    assert restored.tools["web_search"].builtin == "protolink.tools.builtins.web:web_search"
    with pytest.raises(PolicyDeniedError):
        await restored.call_tool("web_search", query="Athens", engine="wikipedia")
    assert network.lookups == []


# -- examples/builtin_web_search.py --------------------------------------------------------------


def load_example():
    path = Path(__file__).resolve().parents[3] / "examples" / "builtin_web_search.py"
    spec = importlib.util.spec_from_file_location("builtin_web_search_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_example_prints_help_without_a_query_and_sends_nothing(network, capsys):
    assert load_example().main([]) == 0

    assert "usage:" in capsys.readouterr().out
    assert network.lookups == []


async def test_the_example_prints_the_normalized_json_through_an_explicit_policy(site, network, capsys):
    site.route(*WIKIPEDIA, Reply(200, JSON, fixture("wikipedia_search_page.json")))
    example = load_example()

    code = await asyncio.to_thread(example.main, ["What is the capital of Greece?", "--max-results", "2"])

    printed = json.loads(capsys.readouterr().out)
    assert code == 0
    assert printed["provider"] == "wikipedia" and [r["title"] for r in printed["results"]] == ["Athens",
                                                                                                "List of capitals of Greece"]


async def test_the_example_reports_configuration_errors(network, monkeypatch, capsys):
    monkeypatch.delenv("BRAVE_SEARCH_API_KEY", raising=False)

    assert await asyncio.to_thread(load_example().main, ["python", "--engine", "brave"]) == 1
    assert "BRAVE_SEARCH_API_KEY" in capsys.readouterr().err
