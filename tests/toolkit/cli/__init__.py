"""Tests of the `ws-mode` command (`ws_mode.toolkit.cli`)."""
