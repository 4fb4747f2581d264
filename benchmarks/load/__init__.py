"""The load test of WebSocket mode: hundreds of sockets running tool-call chains at once, and the
same conversations over plain HTTP at the same concurrency, against the same server process.

``python -m benchmarks.load --connections 300 --turns 5 --lanes 4`` starts the load
server (the reference server, :mod:`ws_mode.toolkit.reference`, behind
:class:`~ws_mode.WebSocketModeMiddleware` under uvicorn) in a subprocess on loopback: this same
module, run as ``python -m benchmarks.load --serve --spec JSON --fd N`` through
:func:`ws_mode.testing._loopback.server_process`, which binds the loopback socket and passes it
down (:mod:`~benchmarks.load.server`). Then it opens ``--connections`` sockets (the
asyncio ``websockets`` client), all of them before any turn starts. Each socket runs one
tool-call chain of ``--turns`` turns on each of its lanes (1 to ``--lanes``, the default lane and
named ones, concurrently): a user message, then ``turns - 1`` times the model asks for a tool
and the client answers with a ``--tool-output-bytes`` output, the last turn is the model's final
answer (:func:`~benchmarks.load.client.run_client`).

``--long`` makes the chains an agent's with longer histories: 25 turns, 4 KiB tool outputs, one
lane per socket (about 100 KiB of history by the last turn).

Then (unless ``--no-http``) the same conversations run over plain HTTP
(:func:`~benchmarks.load.client.run_http_client`): one keep-alive connection per conversation, all
opened before any turn starts, each turn a streamed ``POST /v1/responses`` with the whole history.
With ``--rounds N`` the two sides alternate: sockets then HTTP in the first round, HTTP then sockets
in the second, and so on (:func:`~benchmarks.load.client.run_side`); each side's figures add up over
its rounds.

Every turn is checked on both sides: its output must be exactly what the reference model gives for
that context over plain HTTP (the model is deterministic per context; each distinct chain is run
once over HTTP with the whole history first, :func:`~benchmarks.load.chains.reference_chains`), a
socket turn's events must carry its lane's ``stream_id``, and no error may arrive. The report
(:class:`~benchmarks.load.report.LoadReport`) gives, per side, connections, turns, turns/s,
p50/p99/max turn latency (request sent to terminal event received), errors, the server's and this
process's CPU time per turn, the server's peak RSS, and the ratios WebSocket/HTTP; then the
middleware's counters and the server's RSS at rest. The sockets' peak RSS must stay under a bound
derived from the cache limits (:func:`~benchmarks.load.options.rss_bound`): the run fails when it
does not.

Loopback only, bounded in count and time (``--duration`` caps the whole run); the server
subprocess is always killed, and kills itself if this process dies.

The load test by concept, a module each (this package imports none of them):

- :mod:`~benchmarks.load.options`: the options, their bounds, and the memory model the sockets'
  peak RSS is held to (:func:`~benchmarks.load.options.rss_bound`);
- :mod:`~benchmarks.load.server`: the load server's process (the app, its stats routes,
  ``--serve``);
- :mod:`~benchmarks.load.chains`: the tool-call chains and their reference run over HTTP;
- :mod:`~benchmarks.load.client`: the socket and HTTP clients and one side's round;
- :mod:`~benchmarks.load.report`: a side's and the run's report;
- :mod:`~benchmarks.load.run`: the server's process from the client's side, the rounds, the
  command line.

The server's process imports only :mod:`~benchmarks.load.server` (and what it imports): what
only the clients use (the kit's socket client, the tools' HTTP client, httpx) stays out of its
RSS, which is what the test measures.
"""
