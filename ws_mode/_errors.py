"""The exceptions ws_mode raises to its users."""

from __future__ import annotations


class WSModeError(Exception):
    """Base class of every error ws_mode raises."""


class ConfigError(WSModeError, ValueError):
    """A setting of the middleware or of `Limits` is invalid."""
