"""``ws-mode bench``: what WebSocket mode saves, measured against the reference server or your own.

Not part of the core library: tools around it, needing the ``cli`` extra. The modes, one module
each:

- :mod:`~ws_mode.toolkit.bench.rollout`: ``ws-mode bench``'s default comparison, an agent rollout
  over HTTP, WebSocket mode drop-in and cache-aware against the reference server (the run, the
  medians, the tables, the plot, the JSON);
- :mod:`~ws_mode.toolkit.bench.proxy`: ``ws-mode bench --proxy``, direct HTTP against the socket
  through ``ws-mode proxy`` (the run, the report, and the proxy's process);
- :mod:`~ws_mode.toolkit.bench.url`: ``ws-mode bench --url``, HTTP against the socket on a server
  of your own.

The research benchmarks (the load test, the store benchmark, the peer comparisons) live outside
the package, in the repository's ``benchmarks/`` folder, run from a clone.

What the ``ws-mode bench`` modes share:

- :mod:`~ws_mode.toolkit.bench.options`: a run's options (the command's flags) and the modes it
  compares;
- :mod:`~ws_mode.toolkit.bench.goals`: the project's goals, compared only with ``--check``;
- :mod:`~ws_mode.toolkit.bench.server`: the benchmark server, the reference server in its own
  process (``python -m ws_mode.toolkit.bench.server``);
- :mod:`~ws_mode.toolkit.bench.control`: the measured processes, their CPU and the modelled link;
- :mod:`~ws_mode.toolkit.bench.forward`: the event-forwarding microbenchmark;
- :mod:`~ws_mode.toolkit.bench.turns`: the per-turn microbenchmark (ws_mode's own CPU per socket
  turn, in-process);
- :mod:`~ws_mode.toolkit.bench.in_process`: what the two microbenchmarks need to call the
  middleware with no server (a socket's scope, the event loop).

``--proxy`` runs its server in a child process started as its own module with ``--serve``. This
package imports none of its modules, so ``python -m`` runs each without importing it twice.
"""
