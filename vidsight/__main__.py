"""``python -m vidsight``: the command line without an installed entry point (the device check runs so)."""

import sys

from vidsight.api.cli import main

sys.exit(main())
