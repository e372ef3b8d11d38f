"""``python -m pytest_backendconf.rerun FILE``."""

from ..cli import rerun_main as main

raise SystemExit(main())
