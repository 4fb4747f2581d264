"""Conversations that run through a rolling restart: clients of `examples/client_resume.py`
(the openai SDK, the turn sent again on a new socket after a close or a refused connection)
holding conversations of a few questions each, one after the other, while the test restarts
the servers behind them.

`converse(origin, clients=..., turns=..., roll=...)` starts the clients, calls `roll()` once
every client has had an answer (each holds a socket on a server about to be restarted), then
lets each client finish the conversation it is in and stops it. The `Rolled` outcome counts
the conversations finished and lost, the turns sent again by cause, and the upgrades answered
426 (the example clients do not retry a 426, so such an upgrade ends its conversation).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from openai import OpenAI
from openai.types.responses import Response, ResponsesServerEvent

from examples.client_resume import INSTRUCTIONS, TOOLS, Resend, ResumingAgent

#: How long the clients may take to start, and a conversation to end after the roll.
HANG = 120.0


@dataclass
class Conversation:
    """One finished conversation: its history before the last turn, and the last response."""

    history: list[dict[str, Any]]
    final: Response


@dataclass
class Client:
    """One client thread: its agent, its finished conversations, what stopped it."""

    agent: ResumingAgent
    turns: int
    conversations: list[Conversation] = field(default_factory=list)
    #: The id of every response received (every model call's, tool calls' included).
    received: list[str] = field(default_factory=list)
    answered: int = 0
    failure: BaseException | None = None

    def record(self, event: ResponsesServerEvent) -> None:
        if event.type == "response.completed":
            self.received.append(event.response.id)

    def run(self, stop: threading.Event) -> None:
        """Conversations of `turns` questions, one after the other, until `stop` is set."""
        try:
            while not stop.is_set():
                self.agent.start_over()
                final: Response | None = None
                for number in range(1, self.turns + 1):
                    final = self.agent.ask(f"Question {number}: plan the release.")
                    self.answered += 1
                assert final is not None
                history = self.agent.context[: -len(final.output)]
                self.conversations.append(Conversation(history, final))
        except BaseException as exc:
            self.failure = exc
        finally:
            self.agent.close()


@dataclass
class Rolled:
    """What the conversations gave through the roll."""

    clients: list[Client]

    @property
    def finished(self) -> int:
        return sum(len(client.conversations) for client in self.clients)

    @property
    def lost(self) -> list[BaseException]:
        return [client.failure for client in self.clients if client.failure is not None]

    @property
    def resends(self) -> list[Resend]:
        return [resend for client in self.clients for resend in client.agent.resends]

    @property
    def causes(self) -> collections.Counter[str]:
        return collections.Counter(resend.cause for resend in self.resends)

    @property
    def refused_426(self) -> int:
        """Upgrades answered 426: each ended its conversation (the clients fall back, never
        retry)."""
        return sum("426" in str(failure) for failure in self.lost)

    @property
    def received(self) -> list[str]:
        return [id_ for client in self.clients for id_ in client.received]

    @property
    def whole_context_sends(self) -> int:
        return sum(client.agent.whole_context_sends for client in self.clients)

    def figure(self) -> str:
        """One line: the conversations finished of those begun, the resends by cause."""
        begun = self.finished + len(self.lost)
        causes = ", ".join(f"{count} after {cause}" for cause, count in self.causes.most_common())
        return (
            f"{self.finished}/{begun} conversations finished, {self.refused_426} upgrades "
            f"answered 426; {len(self.resends)} turns sent again ({causes or 'none'}); "
            f"{self.whole_context_sends} sent with the whole context"
        )


def http_answer(
    origin: str, history: list[Any], instructions: str = INSTRUCTIONS, tools: Any = TOOLS
) -> str:
    """What plain HTTP answers for a whole history, asked as the resume client asks (or with
    another client's `instructions` and `tools`): the reference model is deterministic, so a
    conversation continued across servers must end with the same text."""
    body = {"model": "m", "input": history, "instructions": instructions, "tools": tools}
    response = httpx.post(origin + "/v1/responses", json=body, timeout=30)
    response.raise_for_status()
    text: str = response.json()["output"][0]["content"][0]["text"]
    return text


def converse(
    origin: str,
    *,
    clients: int,
    turns: int,
    roll: Callable[[], None],
    model: str = "m",
    attempts: int = 6,
) -> Rolled:
    """Run `clients` clients against `origin` (`http://HOST:PORT`), conversations of `turns`
    questions each, through `roll()`; what they gave."""
    openai = OpenAI(base_url=origin + "/v1", api_key="-", max_retries=0, timeout=30)
    runners = []
    for _ in range(clients):
        out = open(os.devnull, "w")  # noqa: SIM115 - closed with the client below
        runner = Client(ResumingAgent(openai, model=model, attempts=attempts, out=out), turns)
        runner.agent.on_event = runner.record
        runners.append(runner)
    stop = threading.Event()
    threads = [threading.Thread(target=runner.run, args=(stop,)) for runner in runners]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + HANG
        while not all(runner.answered or runner.failure for runner in runners):
            assert time.monotonic() < deadline, "the clients did not start"
            time.sleep(0.02)
        roll()
    finally:
        stop.set()
        for thread in threads:
            thread.join(HANG)
        for runner in runners:
            runner.agent.out.close()
    assert not any(thread.is_alive() for thread in threads), "a conversation never ended"
    return Rolled(runners)
