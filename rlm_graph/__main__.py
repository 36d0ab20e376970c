"""``python -m rlm_graph``: the ``rlm-graph`` command."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
