"""Standalone measurement scripts, each run as `python -m ws_mode.toolkit.benchmarks.NAME`
(see README.md beside them)."""
