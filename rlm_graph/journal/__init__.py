"""The journal: finished nodes of runs in one SQLite file, for resume and replay.

Pure of trio: `store` is the file, `keys` the hashes, `summary` what a run replayed.
The runtime's side (lookups in the model-call path, batched writes) is
`rlm_graph.runtime.replay`. See docs/durability.md.
"""

from __future__ import annotations

from .keys import request_hash, run_key, value_hash
from .store import JournalStore, RunRow, StoredNode
from .summary import ReplaySummary

__all__ = [
    "JournalStore",
    "ReplaySummary",
    "RunRow",
    "StoredNode",
    "request_hash",
    "run_key",
    "value_hash",
]
