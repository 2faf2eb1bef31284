"""`python -m xpyd_operator [kopf run flags]` (the chart's command): `xpyd_operator.entry.main`."""

from xpyd_operator.entry.main import main

if __name__ == "__main__":
    main()
