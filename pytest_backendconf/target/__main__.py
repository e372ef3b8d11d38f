"""``python -m pytest_backendconf.target``: the device runner a target command starts (`_device`)."""

import sys

from ._device import main

sys.exit(main())
