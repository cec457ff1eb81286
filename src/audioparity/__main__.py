"""``python -m audioparity``: the ``audioparity`` command (:func:`audioparity.cli.main`)."""

from audioparity.cli import main

raise SystemExit(main())
