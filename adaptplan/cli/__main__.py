"""``python -m adaptplan.cli ARGS``: the ``adaptplan`` command."""

import sys

from adaptplan.cli import main

sys.exit(main())
