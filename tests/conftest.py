"""Shared test settings: hypothesis profiles, the anyio backend, the opt-in flag for slow runs."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# The suite starts a hundred Python child processes (servers, the command line, examples):
# where the environment asks for no bytecode (PYTHONDONTWRITEBYTECODE), each would compile
# ws_mode and the tests from source again. The suite writes it (to __pycache__, which git
# ignores), for this process and its children.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile(
    "long", deadline=None, suppress_health_check=[HealthCheck.too_slow], max_examples=5000
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default")
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run the long fuzz and load tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def anyio_backend() -> str:
    """Every `@pytest.mark.anyio` test runs on asyncio: the middleware serves under asyncio
    servers (uvicorn, hypercorn, daphne), and trio is not a dependency."""
    return "asyncio"


@pytest.fixture(autouse=True)
def _logging_of_the_command_undone() -> Iterator[None]:
    """Tests that run the `ws-mode` command's `main()` in this process get its logging set up
    (ws_mode's warnings on stderr, `ws_mode._stack` quieted to errors, a filter on uvicorn's
    error log); it is undone after each test, so that whichever tests ran before on the same
    worker, a later test sees ws_mode's warnings as a library user would."""
    names = ["uvicorn.error"] + [
        name for name in logging.root.manager.loggerDict if name.split(".")[0] == "ws_mode"
    ]
    saved = {name: _logger_setup(logging.getLogger(name)) for name in names}
    yield
    for name in logging.root.manager.loggerDict:
        if name.split(".")[0] == "ws_mode" or name == "uvicorn.error":
            logger = logging.getLogger(name)
            level, handlers, filters = saved.get(name, (logging.NOTSET, [], []))
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.filters[:] = filters


def _logger_setup(logger: logging.Logger) -> tuple[int, list[logging.Handler], list[object]]:
    return logger.level, list(logger.handlers), list(logger.filters)
