"""``python -m trainyard.runner RUN_JSON``: run one task attempt (see ``trainyard.runner.main``)."""

from __future__ import annotations

import sys

from trainyard.runner.main import main

sys.exit(main())
