"""http_tool: one configured HTTP API, a fixed origin and base path, as a prepared tool.

Requires the ``integrations`` extra (httpx). The model chooses a path below the base, a method
from the configured set, a string query and an optional JSON body; it never supplies headers,
hosts or absolute URLs. Redirects are returned rather than followed, ambient proxy settings are
ignored and nothing is retried.
"""

from __future__ import annotations

import base64
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal, Optional
from urllib.parse import quote, unquote, urlencode, urlsplit

from pydantic import ConfigDict, Field, JsonValue, create_model

from protolink import deadlines
from protolink.core.tools import Artifact, Preparation, PreparedTool, ToolContext
from protolink.tools.net.media import check_header, is_json, is_text, media_type

from ._budget import within_budget

try:
    import httpx
except ImportError:  # pragma: no cover - depends on the installation
    raise ImportError("http_tool needs the integrations extra: pip install 'protolink[integrations]'") from None

READ_METHODS = ("GET", "HEAD")
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE", "OPTIONS")
MAX_PATH_CHARS = 2048
SELECTED_HEADERS = ("content-type", "location", "retry-after", "etag", "last-modified", "cache-control")

HeaderValues = Mapping[str, str]
Headers = HeaderValues | Callable[[], HeaderValues | Awaitable[HeaderValues]]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}\Z")
_SEGMENT = re.compile(r"(?:[^%]|%[0-9A-Fa-f]{2})*\Z")
_FORBIDDEN_DECODED = re.compile(r"[\x00-\x1f\x7f/\\?#%]")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_SEGMENT_SAFE = "!$&'()*+,;=:@-._~"

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status_code": {"type": "integer"},
        "headers": {"type": "object", "additionalProperties": {"type": "string"}},
        "body": {"description": "Parsed JSON, text, or base64 text, per body_encoding"},
        "body_encoding": {"enum": ["json", "text", "base64"]},
    },
    "required": ["status_code", "headers", "body", "body_encoding"],
    "additionalProperties": False,
}


def http_tool(
    base_url: str,
    *,
    headers: Headers | None = None,
    allowed_methods: Iterable[str] = READ_METHODS,
    allow_http: bool = False,
    timeout_seconds: float = 30,
    max_request_bytes: int = 1_048_576,
    max_response_bytes: int = 1_048_576,
    name: str = "http_request",
) -> PreparedTool:
    """One prepared tool calling ``base_url`` (HTTPS unless ``allow_http=True``).

    Arguments: ``path`` below the base (``items`` and ``/items`` are the same), ``method`` from
    ``allowed_methods``, ``query`` (strings) and a JSON ``body`` (not for GET/HEAD). GET/HEAD need
    ``network.read``, other methods ``network.write``; previews show method, URL, query and body.
    ``headers`` are copied now, or resolved per request when a sync/async callable is given.
    Returns ``status_code``, selected ``headers``, ``body`` and ``body_encoding``
    (json/text/base64); errors and redirects are returned, not raised or followed.
    """
    base = _base_url(base_url, allow_http=allow_http)
    methods = _methods(allowed_methods)
    if not _NAME.match(name):
        raise ValueError(f"invalid tool name {name!r}")
    if not timeout_seconds > 0 or max_request_bytes < 0 or max_response_bytes < 1:
        raise ValueError("timeout_seconds and max_response_bytes must be positive, max_request_bytes >= 0")
    fixed_headers = None if callable(headers) else _checked_headers(headers or {})
    default_method = "GET" if "GET" in methods else methods[0]
    arguments = create_model(
        "HTTPRequestArguments",
        __config__=ConfigDict(extra="forbid"),
        path=(str, Field("", max_length=MAX_PATH_CHARS, description=f"Path below {base}")),
        method=(Literal[methods], Field(default_method, description="HTTP method")),  # type: ignore[valid-type]
        query=(Optional[dict[str, str]], Field(None, description="Query parameters")),
        body=(Optional[JsonValue], Field(None, description="JSON request body (not for GET/HEAD)")),
    )

    async def prepare(args: Any, context: ToolContext) -> Preparation:
        path = _path(args.path)
        if args.method in READ_METHODS and args.body is not None:
            raise ValueError(f"{args.method} requests cannot have a body")
        query = urlencode(args.query or {})
        url = base + path + (f"?{query}" if query else "")
        content = None if args.body is None else json.dumps(args.body, ensure_ascii=False).encode("utf-8")
        size = len(query.encode()) + len(content or b"")
        if size > max_request_bytes:
            raise ValueError(f"the request is {size} bytes, more than max_request_bytes={max_request_bytes}")
        preview = {"method": args.method, "url": url, "path": path, "query": dict(args.query or {}),
                   "body": args.body}

        async def execute(ctx: ToolContext) -> dict[str, Any]:
            request_headers = fixed_headers if fixed_headers is not None else await _resolve(headers)
            if content is not None:
                request_headers = {"Content-Type": "application/json", **request_headers}
            return await _send(args.method, url, request_headers, content, ctx,
                               timeout_seconds=timeout_seconds, max_response_bytes=max_response_bytes)

        capability = "network.read" if args.method in READ_METHODS else "network.write"
        return Preparation(execute=execute, capabilities=(capability,),
                           artifacts=(Artifact("http_request", f"{args.method} {url}", preview),))

    return PreparedTool(
        name=name,
        description=f"Call the HTTP API at {base} with a path below it ({', '.join(methods)}).",
        arguments=arguments,
        prepare=prepare,
        capabilities=tuple(dict.fromkeys(
            "network.read" if method in READ_METHODS else "network.write" for method in methods
        )),
        tags=("builtin", "http", "integration"),
        output_schema=OUTPUT_SCHEMA,
    )


def _base_url(base_url: str, *, allow_http: bool) -> str:
    try:
        parts = urlsplit(base_url)
        _ = parts.port  # raises ValueError for a malformed or out-of-range port
    except ValueError as error:
        raise ValueError(f"invalid base_url: {error}") from None
    schemes = ("https", "http") if allow_http else ("https",)
    if parts.scheme.lower() not in schemes:
        raise ValueError(f"base_url must use {' or '.join(schemes)}" + ("" if allow_http else " (allow_http=True permits http)"))
    if not parts.hostname or "@" in parts.netloc:
        raise ValueError("base_url needs a host and must not contain credentials")
    if parts.query or parts.fragment or "?" in base_url or "#" in base_url:
        raise ValueError("base_url must not contain a query or fragment")
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    return f"{parts.scheme.lower()}://{parts.netloc}{path}"


def _methods(allowed_methods: Iterable[str]) -> tuple[str, ...]:
    methods = tuple(dict.fromkeys(method.upper() for method in allowed_methods))
    unknown = [method for method in methods if method not in READ_METHODS + WRITE_METHODS]
    if not methods or unknown:
        raise ValueError(f"allowed_methods must be among {', '.join(READ_METHODS + WRITE_METHODS)}")
    return methods


def _path(path: str) -> str:
    """The normalized path below the base; traversal, authorities and encoded tricks raise ValueError."""
    if path.startswith("//") or _SCHEME.match(path):
        raise ValueError("path must be relative to the base URL: absolute URLs and authorities are refused")
    if "?" in path or "#" in path:
        raise ValueError("path must not embed a query or fragment: use the query argument")
    if re.search(r"[\x00-\x20\x7f\\]", path):
        raise ValueError("path must not contain whitespace, control characters or backslashes")
    segments = path.lstrip("/").split("/")
    normalized = []
    for index, segment in enumerate(segments):
        if not _SEGMENT.match(segment):
            raise ValueError("path contains a malformed percent-escape")
        try:
            decoded = unquote(segment, errors="strict")
        except UnicodeDecodeError:
            raise ValueError("path contains a percent-escape that is not UTF-8") from None
        if _FORBIDDEN_DECODED.search(decoded):
            raise ValueError("path contains an encoded separator, query, fragment or escape")
        if decoded in (".", ".."):
            raise ValueError("path must not contain '.' or '..' segments")
        if not decoded and index != len(segments) - 1:
            raise ValueError("path must not contain empty segments")
        normalized.append(quote(decoded, safe=_SEGMENT_SAFE))
    return "/".join(normalized)


def _checked_headers(headers: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(headers, Mapping):
        raise TypeError("headers must be a mapping or a callable returning one")
    for name, value in headers.items():
        check_header(name, value)
    return dict(headers)


async def _resolve(headers: Callable[[], HeaderValues | Awaitable[HeaderValues]]) -> dict[str, str]:
    values = headers()
    if inspect.isawaitable(values):
        values = await values
    return _checked_headers(values)


async def _send(method: str, url: str, headers: Mapping[str, str], content: bytes | None, ctx: ToolContext,
                *, timeout_seconds: float, max_response_bytes: int) -> dict[str, Any]:
    async def bounded(timeout: float) -> tuple[httpx.Response, bytearray]:
        scope = deadlines.timeout(timeout)
        # One deadline (the scope) bounds connect, send and read; httpx adds none of its own.
        client = httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=None,
                                   transport=httpx.AsyncHTTPTransport(retries=0))
        try:
            async with scope, client:
                async with client.stream(method, url, headers=headers, content=content) as response:
                    body = bytearray()
                    async for chunk in response.aiter_bytes():
                        body += chunk
                        if len(body) > max_response_bytes:
                            raise RuntimeError(f"the response body exceeds max_response_bytes={max_response_bytes}")
        except TimeoutError:
            if scope.expired():
                raise  # the deadline: within_budget tells the run's budget from the call's timeout
            raise RuntimeError(f"{method} {url} failed: timed out") from None
        except httpx.HTTPError as error:
            raise RuntimeError(f"{method} {url} failed: {error}") from None
        return response, body

    try:
        response, body = await within_budget(ctx, timeout_seconds, f"{method} {url}", bounded)
    except TimeoutError:
        raise RuntimeError(f"{method} {url} timed out after {timeout_seconds:g} seconds") from None
    encoding, decoded = _decode(response, bytes(body))
    return {
        "status_code": response.status_code,
        "headers": {name: response.headers[name] for name in SELECTED_HEADERS if name in response.headers},
        "body": decoded,
        "body_encoding": encoding,
    }


def _decode(response: httpx.Response, body: bytes) -> tuple[str, Any]:
    """JSON when declared and valid, text when textual and decodable, otherwise base64."""
    media = media_type(response.headers.get("content-type"))
    if media is None or is_text(media):
        try:
            text = body.decode(response.charset_encoding or "utf-8")
        except (LookupError, UnicodeDecodeError):
            text = None
        if text is not None:
            if is_json(media) and text.strip():
                try:
                    return "json", json.loads(text)
                except ValueError:
                    pass
            return "text", text
    return "base64", base64.b64encode(body).decode("ascii")
