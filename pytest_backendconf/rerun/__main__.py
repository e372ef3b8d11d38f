"""``python -m pytest_backendconf.rerun FILE``."""

from ..cli._rerun import main

raise SystemExit(main())
