"""``python -m ws_mode.cli``: the ``ws-mode`` command."""

from . import main

raise SystemExit(main())
