"""Where things run: process types and backends, workspace file operations, document extraction.

This package holds the one implementation of each rule; the host tools and the sandbox server
both call it.
"""

from .backends import ExecutionBackend
from .process_types import ProcessCancelledError, ProcessResult, ProcessSpec

__all__ = ["ExecutionBackend", "ProcessCancelledError", "ProcessResult", "ProcessSpec"]
