"""Tests of the tools' shared pieces (`ws_mode.tools`): clients, runner, rollout, measurements."""
