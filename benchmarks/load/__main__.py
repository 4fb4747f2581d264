"""``python -m benchmarks.load``: the load test (:func:`benchmarks.load.run.main`); with
``--serve``, the load server's process (:func:`benchmarks.load.server.serve`), which imports
neither the clients nor the report."""

import sys

if "--serve" in sys.argv[1:]:
    from .server import serve

    sys.exit(serve(sys.argv[1:]))

from .run import main

sys.exit(main())
