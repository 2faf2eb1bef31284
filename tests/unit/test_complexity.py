"""No function or method in operator/src or controller/src is above cyclomatic complexity 15 as radon
counts it (each boolean operator adds one, unlike ruff's C901); a longer one is split into its steps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Function

REPO = Path(__file__).resolve().parents[2]
SOURCES = (REPO / "operator" / "src", REPO / "controller" / "src")
MAX_COMPLEXITY = 15


def _functions(blocks: list[object]) -> Iterator[Function]:
    """Every function and method radon found, with the functions nested in them."""
    for block in blocks:
        if isinstance(block, Function):
            yield block
            yield from _functions(list(block.closures))


def test_no_function_above_max_complexity() -> None:
    files = sorted(path for root in SOURCES for path in root.rglob("*.py"))
    assert files, f"no Python files under {', '.join(map(str, SOURCES))}"
    offenders = [
        f"{path.relative_to(REPO)}:{function.lineno} {function.fullname} ({function.complexity})"
        for path in files
        for function in _functions(cc_visit(path.read_text(encoding="utf-8")))
        if function.complexity > MAX_COMPLEXITY
    ]
    assert not offenders, (
        f"above cyclomatic complexity {MAX_COMPLEXITY} (radon cc): split each into its steps\n"
        + "\n".join(offenders)
    )
