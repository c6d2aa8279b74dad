"""``python -m magnetar``: the same as the ``magnetar`` command."""

import sys

from magnetar.cli import main

sys.exit(main())
