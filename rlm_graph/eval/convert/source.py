"""Reading a published data file's rows: JSON Lines, a JSON array, or Parquet. Pure
(Parquet needs ``pyarrow``, imported only for a ``.parquet`` file).

Invariants:
    - Nothing is downloaded: a converter reads the file the user has.
    - JSON Lines and Parquet are read a row at a time; a JSON array is read whole (that
      is how LongBench-v2 publishes ``data.json``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError

__all__ = ["read_rows", "require_columns"]


def _jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a BOM some editors write
                raw = raw[3:]
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"{path}:{number}: not UTF-8 text (byte {exc.start + 1} of the line)"
                ) from None
            except ValueError as exc:
                raise ConfigError(f"{path}:{number}: not JSON ({exc})") from None
            except RecursionError:
                raise ConfigError(
                    f"{path}:{number}: not JSON (nested past Python's stack)"
                ) from None
            if not isinstance(row, dict):
                raise ConfigError(
                    f"{path}:{number}: a row is a JSON object, not {type(row).__name__}"
                )
            yield row


def _json(path: Path) -> Iterator[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        reason = exc if isinstance(exc, ValueError) else "nested past Python's stack"
        raise ConfigError(
            f"{path} is not JSON ({reason}); give a .json array or a .jsonl file"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise ConfigError(f"{path} must hold a JSON array of rows")
    for index, row in enumerate(data):
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: row {index} is a JSON object, not {type(row).__name__}")
        yield row


def _parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise ConfigError(
            f"{path} is a Parquet file: install pyarrow (pip install pyarrow) to read it, or "
            "export it to JSON Lines first (datasets: ds.to_json('rows.jsonl'))"
        ) from None
    for batch in parquet.ParquetFile(str(path)).iter_batches(batch_size=64):
        yield from batch.to_pylist()


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of ``path`` by its suffix: ``.jsonl``/``.ndjson``, ``.json`` or ``.parquet``.

    Raises:
        ConfigError: a missing file, an unknown suffix, or a row that is not an object.
    """
    if not path.is_file():
        raise ConfigError(f"cannot read {str(path)!r}: no such file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl(path)
    if suffix == ".json":
        return _json(path)
    if suffix == ".parquet":
        return _parquet(path)
    raise ConfigError(
        f"{path}: give a .jsonl, .json or .parquet file (not {suffix or 'no suffix'})"
    )


def require_columns(
    row: Mapping[str, Any], columns: Sequence[str], where: str, source: str
) -> None:
    """Fail on a row without one of ``columns``, naming the published columns.

    Raises:
        ConfigError: naming what is missing and what the row has.
    """
    missing = [c for c in columns if c not in row]
    if missing:
        raise ConfigError(
            f"{where}: no column {', '.join(map(repr, missing))}; {source} rows have "
            f"{', '.join(columns)} (this row has {', '.join(sorted(row)) or 'nothing'})"
        )
