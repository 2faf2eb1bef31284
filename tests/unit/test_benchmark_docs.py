"""`--write` of a benchmark replaces only its generated blocks in docs/BENCHMARKS.md, never the prose
around them (the readings are hand-written and must survive a re-run)."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import autoscaling
import conversion
import policy_variants
from bench_docs import DOCS, markers, replace_generated

BLOCK = re.compile(r"<!-- begin generated: (.+?) -->\n.*?<!-- end generated: \1 -->", re.S)


def outside_blocks(text: str) -> str:
    """The hand-written text: everything but the bodies of the generated blocks."""
    return BLOCK.sub(lambda match: markers(match.group(1))[0], text)


def test_only_the_text_between_a_blocks_markers_changes(tmp_path: Path) -> None:
    begin, end = markers("demo")
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text(f"# Title\n\nWhy this ran.\n\n{begin}\nold table\n{end}\n\nReading: prose.\n")
    replace_generated({"demo": "| new | table |\n"}, docs)
    replace_generated({"demo": "| new | table |\n"}, docs)  # a second write changes nothing more
    assert docs.read_text() == (
        f"# Title\n\nWhy this ran.\n\n{begin}\n| new | table |\n{end}\n\nReading: prose.\n"
    )


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("no markers at all\n", "occurs 0 times"),
        ("{begin}\n{end}\n{begin}\n{end}\n", "occurs 2 times"),
        ("{end}\nbody\n{begin}\n", "comes before"),
    ],
)
def test_a_missing_doubled_or_reversed_marker_fails_naming_it(
    tmp_path: Path, text: str, complaint: str
) -> None:
    begin, end = markers("demo")
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text(text.format(begin=begin, end=end))
    with pytest.raises(ValueError, match=complaint) as error:
        replace_generated({"demo": "table"}, docs)
    assert "'demo'" in str(error.value)
    assert docs.read_text() == text.format(begin=begin, end=end)  # nothing half-written


@pytest.mark.parametrize(
    "block",
    [autoscaling.TABLES_BLOCK, autoscaling.HEADLINE_BLOCK, conversion.BLOCK, policy_variants.BLOCK],
)
def test_every_scripts_block_is_marked_once_in_the_docs(block: str) -> None:
    text = DOCS.read_text(encoding="utf-8")
    begin, end = markers(block)
    assert text.count(begin) == text.count(end) == 1
    assert text.index(begin) < text.index(end)


def fake_outcomes() -> list[autoscaling.Outcome]:
    metrics = {name: 0.5 for name, _, _ in autoscaling.METRICS} | {"recovery_s": 60.0}
    return [
        autoscaling.Outcome(key, policy, seed, metrics | {"goodput": 0.9 + seed / 100}, 1.0)
        for key in ("seed", "step")
        for policy in ("xpyd", "threshold")
        for seed in (1, 2, 3)
    ]


def test_autoscaling_write_keeps_the_sections_hand_written_paragraphs(tmp_path: Path) -> None:
    docs = tmp_path / "BENCHMARKS.md"
    shutil.copy(DOCS, docs)
    table = {k: v for k, v in autoscaling.scenarios().items() if k in ("seed", "step")}
    args = argparse.Namespace(seeds=3, seeds_for=None, hours=6.0)
    blocks = autoscaling.markdown(fake_outcomes(), table, ["xpyd", "threshold"], args, 60.0)
    assert set(blocks) == {autoscaling.TABLES_BLOCK, autoscaling.HEADLINE_BLOCK}
    replace_generated(blocks, docs)
    written = docs.read_text(encoding="utf-8")
    assert outside_blocks(written) == outside_blocks(DOCS.read_text(encoding="utf-8"))
    headline = written[written.index(markers(autoscaling.HEADLINE_BLOCK)[0]) :]
    # Medians with the seeds' range: 91 %, 92 %, 93 % -> 92.0% (91.0–93.0%).
    assert "| xpyd | 3 | 92.0% (91.0–93.0%) · 0.5 (0.5–0.5) |" in headline
    for hand_written in ("Reading:", "Reading. xpyd meets the SLO", autoscaling.SECTION):
        assert hand_written in written
