"""`python -m dasknn` runs the `dasknn` command."""

import sys

from dasknn.cli import main

sys.exit(main())
