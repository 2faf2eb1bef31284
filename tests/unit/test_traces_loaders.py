"""Azure CSV and Mooncake JSONL loaders on small files written here (no third-party data)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from xpyd_controller.sim.traces import (
    TraceError,
    empirical_lengths,
    load_azure_csv,
    load_mooncake_jsonl,
    load_trace,
    mix_drift_day,
)

AZURE_ROWS = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:48.0000000,879,55
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_azure_csv_sorts_and_shifts_to_zero(tmp_path: Path) -> None:
    trace = load_azure_csv(write(tmp_path, "conv.csv", AZURE_ROWS))
    np.testing.assert_allclose(trace.arrival_s, [0.0, 48.0 - 46.68059, 50.995169 - 46.68059], atol=1e-6)
    assert trace.prompt_tokens.tolist() == [374, 879, 396]
    assert trace.output_tokens.tolist() == [44, 55, 109]
    assert trace.prefix_hit_tokens.tolist() == [0, 0, 0]
    assert trace.name == "conv"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,a,b\n", r"x.csv:1: header = \['time', 'a', 'b'\]: must start with TIMESTAMP"),
        ("", r"x.csv:1: header = None"),
        (AZURE_ROWS + "yesterday,5,5\n", r"x.csv:5: TIMESTAMP = 'yesterday': must be an ISO date-time"),
        (AZURE_ROWS + "2023-11-16 18:15:51,abc,5\n", r"x.csv:5: ContextTokens = 'abc': must be an integer"),
        (
            AZURE_ROWS + "2023-11-16 18:15:51,5,0\n",
            r"x.csv:5: GeneratedTokens = '0': must be an integer >= 1",
        ),
        (AZURE_ROWS + "2023-11-16 18:15:51,5\n", r"x.csv:5: row = .*needs 3 columns"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", r"x.csv: requests = 0: the file holds no requests"),
    ],
)
def test_azure_csv_errors_name_file_line_and_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        load_azure_csv(write(tmp_path, "x.csv", text))


def mooncake_line(stamp: object, prompt: object, output: object, blocks: object) -> str:
    return json.dumps(
        {"timestamp": stamp, "input_length": prompt, "output_length": output, "hash_ids": blocks}
    )


def test_mooncake_prefix_hits_from_block_hashes(tmp_path: Path) -> None:
    lines = [
        mooncake_line(0, 1000, 10, [0, 1]),  # all new
        mooncake_line(500, 1500, 20, [0, 1, 2]),  # two leading blocks seen → 1024 tokens
        mooncake_line(1000, 700, 5, [0, 9]),  # one leading block seen → 512
        mooncake_line(2000, 900, 5, [9, 0]),  # 9 seen at line 3, 0 seen → 1024, capped at 899
        mooncake_line(2500, 600, 5, [5, 0]),  # first block new: no prefix hit even though 0 was seen
    ]
    trace = load_mooncake_jsonl(write(tmp_path, "m.jsonl", "\n".join(lines) + "\n\n"))
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.5, 1.0, 2.0, 2.5])
    assert trace.prefix_hit_tokens.tolist() == [0, 1024, 512, 899, 0]
    assert trace.output_tokens.tolist() == [10, 20, 5, 5, 5]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"m.jsonl:2: json = '\{not json': invalid JSON"),
        ("[1, 2]", r"m.jsonl:2: json = '\[1, 2\]': each line must be an object"),
        (json.dumps({"timestamp": 1, "input_length": 5}), r"m.jsonl:2: output_length = None: missing"),
        (mooncake_line("soon", 5, 5, []), r"m.jsonl:2: timestamp = 'soon': must be a number of milliseconds"),
        (mooncake_line(1, 0, 5, []), r"m.jsonl:2: input_length = 0: must be an integer >= 1"),
        (mooncake_line(1, 5.5, 5, []), r"m.jsonl:2: input_length = 5.5"),
        (mooncake_line(1, 5, 5, "abc"), r"m.jsonl:2: hash_ids = 'abc': must be a list of integers"),
    ],
)
def test_mooncake_errors_name_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = write(tmp_path, "m.jsonl", mooncake_line(0, 10, 1, [1]) + "\n" + line + "\n")
    with pytest.raises(TraceError, match=message):
        load_mooncake_jsonl(path)


def test_missing_file_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"path = '.*nope.csv': cannot be read"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(tmp_path / "trace.parquet")


def test_empirical_lengths_build_a_drift_day(tmp_path: Path) -> None:
    chat = write(
        tmp_path, "chat.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,300,200\n"
    )
    code = write(tmp_path, "code.jsonl", mooncake_line(0, 6000, 12, [1]) + "\n")
    day = mix_drift_day(1, 2.0, empirical_lengths(chat), empirical_lengths(code), duration_s=3600.0)
    assert set(zip(day.prompt_tokens.tolist(), day.output_tokens.tolist(), strict=True)) == {
        (300, 200),
        (6000, 12),
    }
