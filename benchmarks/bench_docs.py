"""Replace one benchmark's section of docs/BENCHMARKS.md, leaving every other section untouched."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "BENCHMARKS.md"


def replace_section(heading: str, body: str, keep_from: str | None = None, append: bool = False) -> None:
    """Swap the text under `heading` (up to the next `## `) for `body`.

    `keep_from`: keep the old section's tail from this marker on (another script's subsection).
    `append`: `body` is a subsection: it replaces its previous copy, or goes at the section's end.
    """
    docs = DOCS.read_text(encoding="utf-8")
    start = docs.index(heading)
    end = docs.find("\n## ", start + len(heading))
    end = len(docs) if end < 0 else end
    old = docs[start:end]
    if append:
        # The body is a `### ` subsection: replace its previous copy in place (the subsections after it,
        # other scripts', stay), or add it at the section's end.
        marker = body.splitlines()[0]
        if marker in old:
            at = old.index(marker)
            after = old.find("\n### ", at + len(marker))
            rest = "" if after < 0 else old[after:]
            new = old[:at] + body.strip() + "\n" + ("\n" + rest.strip() + "\n" if rest else "")
        else:
            new = old.rstrip() + "\n\n" + body.strip() + "\n"
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
