"""Tests of `ws-mode bench` and the load test (`ws_mode.toolkit.bench`)."""
