"""Converters from the benchmarks' published files to items (``rlm-graph eval convert``).

| ``--from`` | the file | items |
| --- | --- | --- |
| ``oolong`` | ``oolongbench/oolong-synth`` rows (JSONL, JSON or Parquet) | ``numeric`` / ``label`` |
| ``browsecomp-plus`` | BrowseComp-Plus' decrypted queries (``--corpus`` to fill contexts) | ``exact`` over a list of documents |
| ``longbench-v2`` | LongBench-v2's ``data.json`` (CodeQA's domain unless ``all_domains``) | ``choice`` |

Invariants:
    - Nothing is downloaded: the user downloads the file, a converter reads it.
    - A row without the published columns fails with the columns a row should have.
    - ``filters`` (``{"dataset": "trec_coarse"}``) keep the rows whose column has that
      value (compared as text), before conversion.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from ...errors import ConfigError
from .browsecomp import CorpusIndex, browsecomp_rows
from .longbench import longbench_rows
from .oolong import oolong_rows
from .source import read_rows

__all__ = ["CONVERTERS", "convert", "parse_filters", "write_items"]

CONVERTERS = ("oolong", "browsecomp-plus", "longbench-v2")


def parse_filters(pairs: list[str] | None) -> dict[str, str]:
    """``["dataset=trec_coarse", "context_len=131072"]`` as a dict.

    Raises:
        ConfigError: an entry without ``=``.
    """
    found: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--filter {pair!r}: write COLUMN=VALUE, e.g. dataset=trec_coarse")
        found[key.strip()] = value.strip()
    return found


def _kept(rows: Iterator[dict[str, Any]], filters: Mapping[str, str]) -> Iterator[dict[str, Any]]:
    """The rows every filter keeps; a filter on a column the file does not have (a typo)
    is refused at the first row, not a silent empty result."""
    for number, row in enumerate(rows):
        if number == 0:
            unknown = sorted(set(filters) - set(row))
            if unknown:
                raise ConfigError(
                    f"--filter {unknown[0]!r}: the file has no such column; its columns: "
                    f"{', '.join(sorted(row))}"
                )
        if all(str(row.get(key)) == value for key, value in filters.items()):
            yield row


def convert(
    name: str,
    path: Path,
    *,
    filters: Mapping[str, str] | None = None,
    corpus: Path | None = None,
    docs: int | None = None,
    seed: int = 0,
    all_domains: bool = False,
) -> Iterator[dict[str, Any]]:
    """The items (JSON objects shaped as items-file lines) of a published file.

    Args:
        name: ``oolong``, ``browsecomp-plus`` or ``longbench-v2``.
        path: the file as downloaded.
        filters: keep rows whose column has this value (as text).
        corpus: BrowseComp-Plus' corpus (JSONL), to fill contexts up to ``docs``.
        docs: BrowseComp-Plus documents per context (1,000 with a corpus).
        seed: BrowseComp-Plus' shuffle and draw.
        all_domains: LongBench-v2: keep every domain, not CodeQA's alone.

    Raises:
        ConfigError: an unknown converter, an unreadable file, a row not in the
            published columns, or options that do not go with ``name``.
    """
    if name not in CONVERTERS:
        raise ConfigError(f"unknown converter {name!r}; --from one of {', '.join(CONVERTERS)}")
    if name != "browsecomp-plus" and (corpus is not None or docs is not None):
        raise ConfigError("--corpus and --docs go with --from browsecomp-plus")
    if name != "longbench-v2" and all_domains:
        raise ConfigError("--all-domains goes with --from longbench-v2")
    rows = _kept(read_rows(path), filters or {})
    source = path.name
    if name == "oolong":
        return oolong_rows(rows, source=source)
    if name == "longbench-v2":
        return longbench_rows(rows, source=source, all_domains=all_domains)
    index = CorpusIndex(corpus) if corpus is not None else None
    return browsecomp_rows(rows, source=source, corpus=index, docs=docs, seed=seed)


def write_items(items: Iterator[Mapping[str, Any]], out: IO[str]) -> int:
    """Write items one a line; return how many."""
    count = 0
    for item in items:
        out.write(json.dumps(item, ensure_ascii=False, default=str) + "\n")
        count += 1
    return count
