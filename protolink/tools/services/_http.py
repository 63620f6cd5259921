"""The bounded JSON-over-HTTPS client the Google and Microsoft backends share.

Every request resolves the access token again (a string, or a sync/async callback), uses a fresh
``httpx.AsyncClient`` that is closed on success, error, timeout and cancellation, ignores proxy
environment variables, refuses redirects, reads at most 2 MiB of response and never retries.
HTTP failures raise the backend's :class:`ServiceHTTPError` subclass with ``status_code`` and
never copy the remote error body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import httpx

from protolink.errors import ProtoLinkError

from ._credentials import SecretSource, check_secret_source, resolve_secret

MAX_RESPONSE_BYTES = 2 * 1024 * 1024

TokenSource = SecretSource
_TOKEN = re.compile(r"[\x21-\x7e]+")


class ServiceHTTPError(ProtoLinkError, RuntimeError):
    """An HTTP service call failed. ``status_code`` is the HTTP status, or None when no usable
    response arrived (connection failure, oversized or malformed body)."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


def single_line(value: str, name: str) -> str:
    """``value`` when it is a non-empty single line of at most 1,024 characters (a URL part)."""
    if not isinstance(value, str) or not value or len(value) > 1024 or any(ord(c) < 32 for c in value):
        raise ValueError(f"{name} must be a non-empty single-line string")
    return value


def check_token_source(token: TokenSource) -> TokenSource:
    """A token string or a no-argument callable (checked at construction)."""
    if isinstance(token, str):
        _check_token(token)
    return check_secret_source(token, "token")


def _check_token(token: str) -> str:
    if not _TOKEN.fullmatch(token):
        raise ValueError("the access token must be printable ASCII without whitespace")
    return token


async def resolve_token(token: TokenSource) -> str:
    """The current access token (a callback is called again for every request)."""
    return _check_token(await resolve_secret(token, "access token"))


class _Borrowed(httpx.AsyncBaseTransport):
    """An application-supplied transport: used by each client, closed by its owner."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._inner.handle_async_request(request)


class JSONClient:
    """Bounded JSON requests to one service with one token source.

    ``transport`` (tests, offline examples) replaces the network; it is shared by every request
    and never closed here.
    """

    def __init__(self, token: TokenSource, *, service: str, error: type[ServiceHTTPError],
                 transport: httpx.AsyncBaseTransport | None = None,
                 timeout_seconds: float = 30.0) -> None:
        if not timeout_seconds > 0:
            raise ValueError("timeout_seconds must be > 0")
        self._token = check_token_source(token)
        self._service = service
        self._error = error
        self._transport = transport
        self._timeout = timeout_seconds

    async def request(self, method: str, url: str, *, params: Mapping[str, Any] | None = None,
                      json_body: Any = None, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Send one request; the decoded JSON object (``{}`` for an empty body)."""
        token = await resolve_token(self._token)
        transport = _Borrowed(self._transport) if self._transport is not None else None
        async with httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False,
                                     timeout=self._timeout) as client:
            request = client.build_request(
                method, url, params=params, json=json_body,
                headers={"Accept": "application/json", **(headers or {}),
                         "Authorization": f"Bearer {token}"})
            try:
                response = await client.send(request, stream=True)
            except httpx.HTTPError as error:
                raise self._error(f"{self._service} request failed: {_kind(error)}") from None
            try:
                return await self._decode(response)
            finally:
                await response.aclose()

    async def _decode(self, response: httpx.Response) -> dict[str, Any]:
        status = response.status_code
        if 300 <= status < 400:
            raise self._error(f"{self._service} answered with a redirect (HTTP {status}); "
                              "redirects are refused", status_code=status)
        if status >= 400:
            raise self._error(f"{self._service} request failed with HTTP {status}", status_code=status)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
            raise self._too_large()
        body = bytearray()
        try:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise self._too_large()
        except httpx.HTTPError as error:
            raise self._error(f"{self._service} response failed: {_kind(error)}") from None
        if not body.strip():
            return {}
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            raise self._error(f"{self._service} returned a body that is not JSON") from None
        if not isinstance(data, dict):
            raise self._error(f"{self._service} returned JSON that is not an object")
        return data

    def object_list(self, data: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
        """``data[key]`` as a list of JSON objects (absent: empty); the service error otherwise."""
        items = data.get(key, [])
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise self._error(f"{self._service} returned a malformed {key!r} list")
        return items

    def require_id(self, data: Mapping[str, Any], what: str) -> str:
        """The ``id`` of a created object; the service error when the answer has none."""
        value = data.get("id")
        if not isinstance(value, str) or not value:
            raise self._error(f"{self._service} returned a {what} without an id")
        return value

    def _too_large(self) -> ServiceHTTPError:
        return self._error(f"{self._service} response exceeds {MAX_RESPONSE_BYTES} bytes")


def _kind(error: httpx.HTTPError) -> str:
    """A failure's kind without its message (messages can carry URLs and query text)."""
    return "timed out" if isinstance(error, httpx.TimeoutException) else type(error).__name__
