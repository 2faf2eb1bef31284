"""Replace one benchmark's section of docs/BENCHMARKS.md, leaving every other section untouched.

A script whose section also holds hand-written text (the tree a run is from, its reading) writes only
its generated blocks instead: the text between `<!-- begin generated: NAME -->` and
`<!-- end generated: NAME -->` (`replace_generated`); everything outside the markers stays as written.
"""

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


def markers(name: str) -> tuple[str, str]:
    """The comment lines around generated block `name` (invisible in rendered Markdown)."""
    return f"<!-- begin generated: {name} -->", f"<!-- end generated: {name} -->"


def replace_generated(blocks: dict[str, str], docs: Path = DOCS) -> None:
    """Swap the text between each block's markers for its new body; nothing outside them changes.

    Every marker must be in `docs` exactly once, each begin before its end: a block written by hand
    into the wrong place, or deleted, fails with the marker's text rather than losing a paragraph.
    """
    text = docs.read_text(encoding="utf-8")
    for name, body in blocks.items():
        begin, end = markers(name)
        for marker in (begin, end):
            if text.count(marker) != 1:
                raise ValueError(
                    f"{docs}: generated block {name!r}: marker {marker!r} occurs {text.count(marker)} "
                    "times; it must occur exactly once (put the begin/end pair around the block)"
                )
        start, stop = text.index(begin) + len(begin), text.index(end)
        if stop < start:
            raise ValueError(f"{docs}: generated block {name!r}: {end!r} comes before {begin!r}")
        text = text[:start] + "\n" + body.strip() + "\n" + text[stop:]
    docs.write_text(text, encoding="utf-8")


def publish_blocks(blocks: dict[str, str], write: bool) -> int:
    """Print a benchmark's generated blocks and, when `write`, put them between their markers; 0."""
    print("\n\n".join(body.strip() for body in blocks.values()))
    if write:
        replace_generated(blocks)
    return 0


def publish(heading: str, body: str, write: bool, keep_from: str | None = None, append: bool = False) -> int:
    """Print a benchmark's section and, when `write`, put it in docs/BENCHMARKS.md; 0 for `main`."""
    print(body)
    if write:
        replace_section(heading, body, keep_from, append)
    return 0
