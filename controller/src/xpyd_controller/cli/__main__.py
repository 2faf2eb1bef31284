"""`python -m xpyd_controller.cli` = the `xpyd` console script."""

import sys

from xpyd_controller.cli import main

sys.exit(main())
