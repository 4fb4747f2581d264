"""``python -m ws_mode.toolkit.cli``: the ``ws-mode`` command."""

from . import main

raise SystemExit(main())
