"""``python -m audioparity.cli``: the ``audioparity`` command."""

import sys

from audioparity.cli import main

sys.exit(main())
