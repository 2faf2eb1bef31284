"""The local demo: bring up the real local cluster, show it, and tear it down.

Later issues grow this into the full demo (operator, simulated GPU fleet under drifting traffic, the
controller converting roles live); the cluster lifecycle here is the part they build on.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from types import FrameType

from e2e.harness import start_cluster


def _raise_interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make demo",
        description="Start a real local Kubernetes cluster (kwok fake nodes by default; XPYD_CLUSTER=kind|existing), "
        "print its nodes, and tear it down.",
    )
    parser.add_argument("--nodes", type=int, default=3, help="fake GPU nodes to create (default 3)")
    parser.add_argument(
        "--hold", type=float, default=0, help="seconds to keep the cluster up before teardown"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_interrupt)  # Ctrl-C and SIGTERM both reach the teardown
    started = time.monotonic()
    with start_cluster(nodes=args.nodes) as cluster:
        print(
            f"cluster {cluster.name} ({cluster.provider}) up in {time.monotonic() - started:.1f}s", flush=True
        )
        print(cluster.kubectl("get", "nodes", "-o", "wide").stdout, flush=True)
        print(cluster.kubectl("version").stdout, flush=True)
        if args.hold:
            print(
                f"KUBECONFIG={cluster.kubeconfig}  (holding {args.hold:.0f}s; Ctrl-C tears down)", flush=True
            )
            time.sleep(args.hold)
    print("cluster torn down", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
