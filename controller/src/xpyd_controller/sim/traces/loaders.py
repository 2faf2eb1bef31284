"""Readers for public request traces: the Azure LLM inference CSV and the Mooncake JSONL.

The only file I/O of the trace package. Each reader takes any path, parses every line once into the
columnar `Trace` (times shifted so the first arrival is at 0, sorted), and reports a bad line as
file:line, field, value and rule.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np

from xpyd_controller.sim.traces.records import Trace, TraceError
from xpyd_controller.sim.traces.synthetic import EmpiricalLengths

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
MOONCAKE_BLOCK_TOKENS = 512


def _positive_int(raw: object, field: str, source: str, line: int) -> int:
    try:
        value = int(str(raw)) if isinstance(raw, str) else raw
    except ValueError:
        raise TraceError(field, raw, "must be an integer", source=source, line=line) from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TraceError(field, raw, "must be an integer >= 1", source=source, line=line)
    return value


def _assemble(
    source: str, times: list[float], prompts: list[int], outputs: list[int], hits: list[int]
) -> Trace:
    if not times:
        raise TraceError("requests", 0, "the file holds no requests", source=source)
    arrival = np.asarray(times, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order] - arrival[order[0]]
    pick = [np.asarray(column, dtype=np.int64)[order] for column in (prompts, outputs, hits)]
    return Trace(arrival, pick[0], pick[1], pick[2], name=Path(source).stem)


def _open_lines(path: Path) -> Iterator[str]:
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            yield from handle
    except OSError as error:
        raise TraceError("path", str(path), f"cannot be read ({error.strerror})") from None


def load_azure_csv(path: str | Path) -> Trace:
    """Azure LLM inference trace 2023 (`TIMESTAMP,ContextTokens,GeneratedTokens`); no prefix data."""
    source = str(path)
    rows = csv.reader(_open_lines(Path(path)))
    header = next(rows, None)
    if header is None or tuple(column.strip() for column in header[:3]) != AZURE_COLUMNS:
        raise TraceError(
            "header", header, f"must start with {','.join(AZURE_COLUMNS)}", source=source, line=1
        )
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        if len(row) < 3:
            raise TraceError("row", row, "needs 3 columns", source=source, line=line)
        try:
            times.append(datetime.fromisoformat(row[0].strip()).timestamp())
        except ValueError:
            raise TraceError(
                "TIMESTAMP", row[0], "must be an ISO date-time", source=source, line=line
            ) from None
        prompts.append(_positive_int(row[1].strip(), "ContextTokens", source, line))
        outputs.append(_positive_int(row[2].strip(), "GeneratedTokens", source, line))
    return _assemble(source, times, prompts, outputs, [0] * len(times))


def _mooncake_record(text: str, source: str, line: int) -> dict[str, object]:
    """One line as a JSON object holding every required field; a bad line names its start and why."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise TraceError(
            "json", text.strip()[:60], f"invalid JSON ({error.msg})", source=source, line=line
        ) from None
    if not isinstance(record, dict):
        raise TraceError("json", text.strip()[:60], "each line must be an object", source=source, line=line)
    for field in MOONCAKE_FIELDS:
        if field not in record:
            raise TraceError(field, None, "missing", source=source, line=line)
    return record


def _mooncake_seconds(stamp: object, source: str, line: int) -> float:
    """The arrival in seconds from Mooncake's milliseconds; a bool, a string or a non-finite number is
    refused rather than read as a time."""
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not np.isfinite(stamp):
        raise TraceError("timestamp", stamp, "must be a number of milliseconds", source=source, line=line)
    return float(stamp) / 1000.0


def _hash_ids(blocks: object, source: str, line: int) -> list[int]:
    """The request's prompt block hashes (none if absent): a list of integers, bools refused."""
    if not isinstance(blocks, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) for b in blocks
    ):
        raise TraceError("hash_ids", blocks, "must be a list of integers", source=source, line=line)
    return blocks


def _cached_blocks(blocks: list[int], seen: set[int]) -> int:
    """How many of the leading blocks an unbounded shared cache already holds (a prefix hit stops at the
    first block not seen); the request's blocks are then cached for the requests after it."""
    cached = 0
    while cached < len(blocks) and blocks[cached] in seen:
        cached += 1
    seen.update(blocks)
    return cached


def load_mooncake_jsonl(path: str | Path, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """Mooncake trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`).

    Prefix hits assume an unbounded cache shared by the fleet: a request's hit is its leading run of
    `hash_ids` blocks seen in earlier requests, in tokens, capped at prompt − 1 (an engine always
    computes the last prompt token).
    """
    source = str(path)
    seen: set[int] = set()
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    hits: list[int] = []
    for line, text in enumerate(_open_lines(Path(path)), start=1):
        if not text.strip():
            continue
        record = _mooncake_record(text, source, line)
        arrival = _mooncake_seconds(record["timestamp"], source, line)
        prompt = _positive_int(record["input_length"], "input_length", source, line)
        cached = _cached_blocks(_hash_ids(record.get("hash_ids", []), source, line), seen)
        times.append(arrival)
        prompts.append(prompt)
        outputs.append(_positive_int(record["output_length"], "output_length", source, line))
        hits.append(min(cached * block_tokens, prompt - 1))
    return _assemble(source, times, prompts, outputs, hits)


def load_trace(path: str | Path) -> Trace:
    """Load by extension: `.csv` as Azure, `.jsonl` as Mooncake."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return load_azure_csv(path)
    if suffix == ".jsonl":
        return load_mooncake_jsonl(path)
    raise TraceError(
        "path", str(path), "unknown trace format: expected a .csv (Azure) or .jsonl (Mooncake) file"
    )


def empirical_lengths(path: str | Path) -> EmpiricalLengths:
    """The joint (prompt, output) length distribution of a trace file, for synthetic days."""
    return EmpiricalLengths.of(load_trace(path))
