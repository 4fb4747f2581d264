"""``ws-mode bench`` and the load test: what WebSocket mode saves, and what it holds, measured.

Not part of the core library: tools around it, needing the ``cli`` extra. The modules:

- :mod:`~ws_mode.bench.options`: a run's options and the modes it compares;
- :mod:`~ws_mode.bench.run`: the run (the server in its own process, the rollouts, medians);
- :mod:`~ws_mode.bench.report`: the tables, the plot, the JSON;
- :mod:`~ws_mode.bench.goals`: the project's goals, compared only with ``--check``;
- :mod:`~ws_mode.bench.server`: the benchmark server (``python -m ws_mode.bench.server``);
- :mod:`~ws_mode.bench.control`: the measured processes, their CPU and the modelled link;
- :mod:`~ws_mode.bench.forward`: the event-forwarding microbenchmark;
- :mod:`~ws_mode.bench.proxy`, with :mod:`~ws_mode.bench.proxy_server` and
  :mod:`~ws_mode.bench.proxy_report`: ``--proxy``, direct HTTP against the socket through
  ``ws-mode proxy``;
- :mod:`~ws_mode.bench.url`: ``--url``, HTTP against the socket on a server of your own;
- :mod:`~ws_mode.bench.load` (``python -m ws_mode.bench.load``), with
  :mod:`~ws_mode.bench.load_options`, :mod:`~ws_mode.bench.load_clients`,
  :mod:`~ws_mode.bench.load_http`, :mod:`~ws_mode.bench.load_sides`,
  :mod:`~ws_mode.bench.load_report` and :mod:`~ws_mode.bench.load_server`: up to thousands of
  sockets at once, under a memory bound, against HTTP at the same concurrency;
- :mod:`~ws_mode.bench.store` (``python -m ws_mode.bench.store --redis URL``), with
  :mod:`~ws_mode.bench.store_report` and :mod:`~ws_mode.bench.store_server`: what the Redis
  store costs per turn, per hydration and under 200 sockets.

This package imports none of them, so ``python -m`` runs each without importing it twice.
"""
