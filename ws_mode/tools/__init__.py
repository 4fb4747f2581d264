"""Shared building blocks of ws-mode's tools (bench, load, rollout, CLI): not the core library.

Each module imports its heavy optional dependencies (httpx, rich, uvicorn, ...) inside the
functions that need them, so importing :mod:`ws_mode.tools` needs nothing beyond the core.
"""
