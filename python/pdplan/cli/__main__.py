"""``python -m pdplan.cli``: the command, as the ``pdplan`` script runs it."""

import sys

from pdplan.cli import main

sys.exit(main())
