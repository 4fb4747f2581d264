"""The lab: research benchmarks, run from a clone as ``python -m benchmarks.NAME`` (see README.md
beside them). Never installed: the wheel holds the library, the kit and the ``ws-mode`` command."""
