"""Tests of `ws_mode.toolkit.bench` (`ws-mode bench`, the load test, the store benchmark), a
file per module."""
