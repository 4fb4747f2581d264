"""FastAPI dependencies for WebSocket mode handlers: the current `Turn` as a parameter.

Import it in your app (the core never does; it needs FastAPI)::

    from .fastapi import CurrentTurn, current_turn

    @app.post("/v1/responses")
    async def create(request: Request, current: CurrentTurn) -> Response: ...

    # the same, spelled out:
    async def create(request: Request, current: Turn | None = Depends(current_turn)) -> ...

`current` is the `Turn` of a socket turn, None over plain HTTP: exactly `ws_mode.turn(request)`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from ._turn import Turn, turn

__all__ = ["CurrentTurn", "current_turn"]


def current_turn(connection: HTTPConnection) -> Turn | None:
    """The `Turn` of the request when ws_mode made it (a socket turn), None over plain HTTP.

    A FastAPI dependency: `current: Turn | None = Depends(current_turn)`.
    """
    return turn(connection)


#: A handler parameter annotated `CurrentTurn` gets `current_turn(request)`.
CurrentTurn = Annotated[Turn | None, Depends(current_turn)]
