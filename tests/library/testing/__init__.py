"""Tests of the compatibility kit (`ws_mode.testing`), one file per module of the kit."""
