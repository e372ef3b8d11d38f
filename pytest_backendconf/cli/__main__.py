"""``python -m pytest_backendconf.cli``: the ``backendconf`` command."""

from ._main import main

raise SystemExit(main())
