"""BrowseComp-Plus' published queries (``Tevatron/browsecomp-plus``) as items. Pure.

The queries come obfuscated; BrowseComp-Plus' ``scripts_build_index/decrypt_dataset.py``
writes them decrypted (``browsecomp_plus_decrypted.jsonl``), one row per query with
``query_id``, ``query``, ``answer``, and the documents ``evidence_docs``, ``gold_docs``
and ``negative_docs`` (each a list of ``{"docid", "text", "url"}``). The corpus
(``Tevatron/browsecomp-plus-corpus``, rows ``docid``, ``text``, ``url``) is not
obfuscated.

An item's context is a list of documents, as the RLM paper's "BrowseComp-Plus (1K
documents)" gives it: every evidence, gold and negative document of the query, filled up
to ``docs`` documents (1,000 in the paper) with documents drawn from the corpus, in an
order shuffled with the seed. Without a corpus, the query's own documents only.

Scoring: ``exact`` (the question asks for the exact answer alone). BrowseComp-Plus'
leaderboard grades with an LLM judge, which also accepts an answer in other words:
exact match is the stricter, judge-free reading.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from .source import require_columns

__all__ = ["COLUMNS", "CorpusIndex", "browsecomp_rows"]

COLUMNS = ("query_id", "query", "answer")
_DOC_LISTS = ("evidence_docs", "gold_docs", "negative_docs")
_INSTRUCTION = (
    "\n\nThe documents are in the context. Answer with the exact answer only: a name, a "
    "number or a short phrase, without explanation."
)


def _document(doc: Mapping[str, Any]) -> str:
    url = f" ({doc['url']})" if doc.get("url") else ""
    return f"Document {doc.get('docid', '?')}{url}\n{doc.get('text', '')}"


class CorpusIndex:
    """The corpus file, indexed by ``docid`` -> byte offset of its line (read on demand,
    so a corpus of many gigabytes is never held in memory).

    Args:
        path: a JSON Lines file of ``{"docid", "text", "url"}`` rows.

    Raises:
        ConfigError: the file cannot be read, or a line has no ``docid``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offsets: dict[str, int] = {}
        try:
            with path.open("rb") as handle:
                offset = 0
                for number, line in enumerate(handle, start=1):
                    if line.strip():
                        self.offsets[self._docid(line, number)] = offset
                    offset += len(line)
        except OSError as exc:
            raise ConfigError(f"cannot read the corpus {str(path)!r}: {exc.strerror}") from None

    def _docid(self, line: bytes, number: int) -> str:
        try:
            return str(json.loads(line)["docid"])
        except (ValueError, KeyError, TypeError, RecursionError):
            raise ConfigError(
                f"{self.path}:{number}: a corpus row has a 'docid' (and 'text', 'url')"
            ) from None

    def get(self, docid: str) -> dict[str, Any]:
        with self.path.open("rb") as handle:
            handle.seek(self.offsets[docid])
            row: dict[str, Any] = json.loads(handle.readline())
            return row


def _looks_obfuscated(query: str) -> bool:
    return " " not in query.strip() and len(query) > 40


def browsecomp_rows(
    rows: Iterable[Mapping[str, Any]],
    *,
    source: str,
    corpus: CorpusIndex | None = None,
    docs: int | None = None,
    seed: int = 0,
) -> Iterator[dict[str, Any]]:
    """Items (as JSON objects) from decrypted BrowseComp-Plus rows.

    Args:
        rows: the decrypted query rows.
        source: the file's name, for messages.
        corpus: the corpus, to fill each context up to ``docs`` documents.
        docs: documents per context (default 1,000 with a corpus; without one, the
            query's own documents).
        seed: shuffles each context and draws the corpus documents.

    Raises:
        ConfigError: a row without the published columns, or still obfuscated.
    """
    if docs is not None and docs < 1:
        raise ConfigError(f"--docs must be at least 1, not {docs}")
    wanted = docs if docs is not None else (1000 if corpus is not None else None)
    for index, row in enumerate(rows):
        where = f"{source} row {index}"
        require_columns(row, COLUMNS, where, "decrypted BrowseComp-Plus")
        if _looks_obfuscated(str(row["query"])):
            raise ConfigError(
                f"{where}: the query looks obfuscated; run BrowseComp-Plus' "
                "scripts_build_index/decrypt_dataset.py and convert its decrypted JSONL"
            )
        rng = random.Random(f"browsecomp-plus/{seed}/{row['query_id']}")
        own: dict[str, Mapping[str, Any]] = {}
        for name in _DOC_LISTS:
            for doc in row.get(name) or []:
                own.setdefault(str(doc.get("docid")), doc)
        documents = list(own.values())
        if corpus is not None and wanted is not None and len(documents) < wanted:
            pool = [d for d in corpus.offsets if d not in own]
            extra = rng.sample(pool, min(len(pool), wanted - len(documents)))
            documents += [corpus.get(docid) for docid in sorted(extra)]
        rng.shuffle(documents)
        yield {
            "id": str(row["query_id"]),
            "question": str(row["query"]) + _INSTRUCTION,
            "answer": str(row["answer"]),
            "answer_type": "exact",
            "context": [_document(doc) for doc in documents],
            "meta": {
                "source": "browsecomp-plus",
                "query_id": row["query_id"],
                "documents": len(documents),
                **{
                    name: [str(d.get("docid")) for d in row.get(name) or []]
                    for name in ("evidence_docs", "gold_docs")
                },
            },
        }
