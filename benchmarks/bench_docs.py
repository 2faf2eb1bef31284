"""Replace one benchmark's section of docs/BENCHMARKS.md, leaving every other section untouched."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"


def replace_section(heading: str, body: str, keep_from: str | None = None, append: bool = False) -> None:
    """Swap the text under `heading` (up to the next `## `) for `body`.

    `keep_from`: keep the old section's tail from this marker on (another script's subsection).
    `append`: put `body` after the old section's text (minus any previous copy of `body`'s heading).
    """
    docs = DOCS.read_text(encoding="utf-8")
    start = docs.index(heading)
    end = docs.find("\n## ", start + len(heading))
    end = len(docs) if end < 0 else end
    old = docs[start:end]
    if append:
        marker = body.splitlines()[0]
        head = old[: old.index(marker)] if marker in old else old
        new = head.rstrip() + "\n\n" + body.strip() + "\n"
    else:
        tail = old[old.index(keep_from) :] if keep_from and keep_from in old else ""
        new = body.strip() + "\n" + (f"\n{tail.strip()}\n" if tail else "")
    DOCS.write_text(docs[:start] + new + docs[end:], encoding="utf-8")


def publish(heading: str, body: str, write: bool, keep_from: str | None = None, append: bool = False) -> int:
    """Print a benchmark's section and, when `write`, put it in docs/BENCHMARKS.md; 0 for `main`."""
    print(body)
    if write:
        replace_section(heading, body, keep_from, append)
    return 0
