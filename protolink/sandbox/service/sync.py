"""The blocking client, for scripts and notebooks: the async client on an event loop of its own
(a daemon thread), so it works where a loop already runs (Jupyter) and where none does::

    with SyncServiceClient(token=...) as service:
        with service.create(workspace=True) as sandbox:
            print(sandbox.run(["echo", "hi"]).stdout)
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from protolink.errors import ToolExecutionError
from protolink.execution.process_types import NO_EVENTS, ProcessResult, ProcessSpec

from ..transfer import TransferResult
from ..typed import COMMAND_ENV, as_typed, typed_argv
from .client import Sandbox, SandboxStatus, ServiceClient, connect

T = TypeVar("T")


class SyncServiceClient:
    """:class:`~.client.ServiceClient` with blocking methods; takes :func:`~.client.connect`'s arguments."""

    def __init__(self, address: str | None = None, token: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="protolink-service-client", daemon=True)
        self._thread.start()
        try:
            self._client: ServiceClient = self.call(connect(address, token, **options))
        except BaseException:
            self._stop()
            raise

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the client's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def create(self, template: str = "", **options: Any) -> SyncSandbox:
        """:meth:`ServiceClient.create <.client.ServiceClient.create>`, blocking."""
        return SyncSandbox(self, self.call(self._client.create(template, **options)))

    def list(self) -> list[SandboxStatus]:
        return self.call(self._client.list())

    def get(self, sandbox_id: str) -> SandboxStatus:
        return self.call(self._client.get(sandbox_id))

    def renew(self, sandbox_id: str, ttl_seconds: float | None = None) -> SandboxStatus:
        return self.call(self._client.renew(sandbox_id, ttl_seconds))

    def delete(self, sandbox_id: str) -> None:
        self.call(self._client.delete(sandbox_id))

    def close(self) -> None:
        if self._loop.is_running():
            self.call(self._client.aclose())
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncServiceClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncSandbox:
    """A sandbox of a :class:`SyncServiceClient`: ``run`` a command, ``upload`` and ``download``
    files, ``renew``, ``delete``; ``with``
    it to delete it at the end. ``backend`` is the async backend, for :meth:`SyncServiceClient.call`."""

    def __init__(self, client: SyncServiceClient, sandbox: Sandbox) -> None:
        self._client = client
        self._sandbox = sandbox
        self.backend = sandbox.backend

    @property
    def id(self) -> str:
        return self._sandbox.id

    @property
    def status(self) -> SandboxStatus:
        return self._sandbox.status

    def run(self, argv: Sequence[str], *, cwd: str = "/tmp", env: Mapping[str, str] = COMMAND_ENV,
            timeout: float = 60.0, max_output_bytes: int = 1 << 20) -> ProcessResult:
        """Run ``argv`` (argv[0] an absolute path, or looked up in ``env``'s PATH in the sandbox)."""
        spec = ProcessSpec(tuple(typed_argv(argv)), cwd, dict(env), timeout, max_output_bytes)
        try:
            return self._client.call(self.backend.execute(spec, NO_EVENTS))
        except ToolExecutionError as error:  # it could not start: named as the caller typed it
            raise ToolExecutionError(as_typed(str(error), argv)) from None

    def renew(self, ttl_seconds: float | None = None) -> SandboxStatus:
        return self._client.call(self._sandbox.renew(ttl_seconds))

    def upload(self, source: str | os.PathLike[str], destination: str, **options: Any) -> TransferResult:
        """See :meth:`.client.Sandbox.upload`."""
        return self._client.call(self._sandbox.upload(source, destination, **options))

    def download(self, source: str, destination: str | os.PathLike[str], **options: Any) -> TransferResult:
        """See :meth:`.client.Sandbox.download`."""
        return self._client.call(self._sandbox.download(source, destination, **options))

    def delete(self) -> None:
        self._client.call(self._sandbox.delete())

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.delete()
