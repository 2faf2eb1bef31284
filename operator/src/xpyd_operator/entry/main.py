"""`python -m xpyd_operator [kopf run flags]`: the operator with its handlers module preset.

Examples: `python -m xpyd_operator --all-namespaces`, `python -m xpyd_operator --namespace team-a`.
"""

from __future__ import annotations

import sys

from kopf.cli import main as kopf_main

HANDLERS_MODULE = "xpyd_operator.entry.handlers"


def main() -> None:
    sys.argv = [sys.argv[0], "run", "--standalone", "-m", HANDLERS_MODULE, *sys.argv[1:]]
    kopf_main()
