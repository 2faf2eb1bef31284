"""`python -m xpyd_operator [kopf run flags]`: the operator with its handlers module preset.

Examples: `python -m xpyd_operator --all-namespaces`, `python -m xpyd_operator --namespace team-a`.
"""

from __future__ import annotations

import sys

from kopf.cli import main


def run() -> None:
    sys.argv = [sys.argv[0], "run", "--standalone", "-m", "xpyd_operator.handlers", *sys.argv[1:]]
    main()


if __name__ == "__main__":
    run()
