"""The journal file itself: several workers may open a new one at the same moment."""

from __future__ import annotations

import threading
from pathlib import Path

from rlm_graph.journal.store import JournalStore


def test_workers_opening_one_new_journal_at_once_all_succeed(tmp_path: Path) -> None:
    # A batch's workers each open the batch's journal as their first completion starts:
    # creating the schema must be one step, never half-seen by a neighbour.
    for round_ in range(20):
        path = tmp_path / f"shared-{round_}.sqlite"
        start = threading.Barrier(8)
        outcomes: list[str] = []

        def open_it() -> None:
            start.wait()
            try:
                JournalStore(path).begin("key", "rlm", "label")
            except Exception as exc:  # reported below
                outcomes.append(f"{type(exc).__name__}: {exc}")
            else:
                outcomes.append("ok")

        workers = [threading.Thread(target=open_it) for _ in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert outcomes == ["ok"] * 8
