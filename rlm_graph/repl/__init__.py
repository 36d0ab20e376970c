"""The guest side of the REPL: namespace, protocol functions, output capture.

Pure Python, no trio: shared by the in-process (``local``) and child-process
(``subprocess``) environments.
"""

from __future__ import annotations

from .capture import CappedBuffer, capture_output
from .session import (
    RESERVED_NAMES,
    SUBCALL_NAMES,
    BlockInterrupted,
    LimitStop,
    ReplSession,
    SubcallCaller,
)

__all__ = [
    "RESERVED_NAMES",
    "SUBCALL_NAMES",
    "BlockInterrupted",
    "CappedBuffer",
    "LimitStop",
    "ReplSession",
    "SubcallCaller",
    "capture_output",
]
