"""The host side of the sandbox appliance: the gRPC client backend and the Docker lifecycle."""

from . import errors
from .client import SandboxBackend, SandboxInfo, connect
