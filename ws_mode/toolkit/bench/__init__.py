"""``ws-mode bench`` and the load test: what WebSocket mode saves, and what it holds, measured.

Not part of the core library: tools around it, needing the ``cli`` extra. The modules:

- :mod:`~ws_mode.toolkit.bench.options`: a run's options and the modes it compares;
- :mod:`~ws_mode.toolkit.bench.run`: the run (the server in its own process, the rollouts, medians);
- :mod:`~ws_mode.toolkit.bench.report`: the tables, the plot, the JSON;
- :mod:`~ws_mode.toolkit.bench.goals`: the project's goals, compared only with ``--check``;
- :mod:`~ws_mode.toolkit.bench.server`: the benchmark server (``python -m
  ws_mode.toolkit.bench.server``);
- :mod:`~ws_mode.toolkit.bench.control`: the measured processes, their CPU and the modelled link;
- :mod:`~ws_mode.toolkit.bench.forward`: the event-forwarding microbenchmark;
- :mod:`~ws_mode.toolkit.bench.proxy`, with :mod:`~ws_mode.toolkit.bench.proxy_server` and
  :mod:`~ws_mode.toolkit.bench.proxy_report`: ``--proxy``, direct HTTP against the socket through
  ``ws-mode proxy``;
- :mod:`~ws_mode.toolkit.bench.url`: ``--url``, HTTP against the socket on a server of your own;
- :mod:`~ws_mode.toolkit.bench.load` (``python -m ws_mode.toolkit.bench.load``), with
  :mod:`~ws_mode.toolkit.bench.load_options`, :mod:`~ws_mode.toolkit.bench.load_clients`,
  :mod:`~ws_mode.toolkit.bench.load_http`, :mod:`~ws_mode.toolkit.bench.load_sides`,
  :mod:`~ws_mode.toolkit.bench.load_report` and :mod:`~ws_mode.toolkit.bench.load_server`: up to
  thousands of sockets at once, under a memory bound, against HTTP at the same concurrency;
- :mod:`~ws_mode.toolkit.bench.store` (``python -m ws_mode.toolkit.bench.store --redis URL``), with
  :mod:`~ws_mode.toolkit.bench.store_report` and :mod:`~ws_mode.toolkit.bench.store_server`: what
  the Redis store costs per turn, per hydration and under 200 sockets.

This package imports none of them, so ``python -m`` runs each without importing it twice.
"""
