"""``python -m protolink.sandbox.service``: :mod:`.daemon`."""

import sys

from .daemon import main

sys.exit(main())
