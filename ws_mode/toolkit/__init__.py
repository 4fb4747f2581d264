"""The toolkit built on ws_mode: the `ws-mode` command, the reference server, the benchmarks, the
load and link tools and the `check` probes. The library never imports it."""
