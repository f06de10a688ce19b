"""``python -m xpuruntime``: the ``xpuruntime`` command line (see :mod:`xpuruntime.cli`)."""

import sys

from .cli import main

sys.exit(main())
