"""Conversation programs: what the compatibility kit drives over the socket.

A program is a list of abstract steps ("continue the latest response", "fork from response 2",
"a fresh chain", ...). Which ids to continue, which tool calls to answer and what the full context
is are only decided while the program runs, from the responses the server actually returned, so
one program works against a deterministic handler and a real model alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .._protocol import SOCKET_ONLY_FIELDS, STREAM_ID

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


#: What a step builds on: "continue" the latest response of its lane (of any lane when its own
#: has none), "fork" from an older response, start a "fresh" chain, or "recover": resend the
#: full context of an older response with `previous_response_id` null.
Action = Literal["continue", "fork", "fresh", "recover"]
#: How a user message is sent: a plain "string", a {"role", "content"} "message", a typed
#: message with input_text "parts", a "developer" message followed by a user message, or
#: "empty" input (warm-ups only). Tool calls the parent left unanswered are always answered
#: with function_call_output items instead.
InputForm = Literal["string", "message", "parts", "developer", "empty"]
#: Wrong input a step sends, which the API refuses: a function_call_output whose call_id matches
#: no call ("unknown_call"), two outputs for one call ("duplicate_output"), or a user message
#: instead of the outputs the parent's tool calls wait for ("missing_outputs"). The last two
#: need a parent with unanswered calls; without one the step sends an unknown call's output.
WrongInput = Literal["unknown_call", "duplicate_output", "missing_outputs"]

ACTIONS: tuple[Action, ...] = ("continue", "fork", "fresh", "recover")
FORMS: tuple[InputForm, ...] = ("message", "string", "parts", "developer")
WRONG_INPUTS: tuple[WrongInput, ...] = ("unknown_call", "duplicate_output", "missing_outputs")

DEFAULT_INSTRUCTIONS: tuple[str | None, ...] = (None, "Be brief.", "Use the tools when they help.")
#: A function tool any model can call (the conformance cases ask for it too).
LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up in the dictionary.",
    "parameters": {
        "type": "object",
        "properties": {"word": {"type": "string"}},
        "required": ["word"],
        "additionalProperties": False,
    },
    "strict": True,
}
_SEARCH: dict[str, Any] = {
    "type": "function",
    "name": "search",
    "description": "Search the project's files for a pattern.",
    "parameters": {
        "type": "object",
        "properties": {"pattern": {"type": "string"}},
        "required": ["pattern"],
        "additionalProperties": False,
    },
    "strict": True,
}
DEFAULT_TOOLS: tuple[tuple[dict[str, Any], ...] | None, ...] = (
    None,
    (LOOKUP_TOOL,),
    (_SEARCH, LOOKUP_TOOL),
)
DEFAULT_MODELS: tuple[str, ...] = ("ws-mode-check",)
DEFAULT_LANES: tuple[str | None, ...] = (None, "main", "side")
DEFAULT_FIELDS: tuple[dict[str, Any], ...] = (
    {},
    {"store": False},
    {"metadata": {"suite": "ws_mode.testing"}},
    {"parallel_tool_calls": False},
    {"stream": True},
)

# Fields a step sets itself, or that only exist on the socket.
_RESERVED_FIELDS = SOCKET_ONLY_FIELDS | {
    "input",
    "previous_response_id",
    "background",
    "model",
    "instructions",
    "tools",
}


@dataclass(frozen=True)
class Step:
    """One `response.create` of a program, described abstractly.

    `parent` picks the response a "fork" or "recover" builds on: an index, modulo their count,
    into the responses of the run that can still be continued (oldest first). `generate=False`
    makes the step a warm-up. `text` is the user message, or the output given to each tool
    call the parent left unanswered. `fields` holds other request fields sent as they are
    (`store`, `metadata`, `temperature`, ...). `wrong` makes the step send wrong input (it
    must generate): the socket must answer it as HTTP does.
    """

    action: Action = "continue"
    parent: int = 0
    generate: bool = True
    text: str = "Hello"
    form: InputForm = "message"
    instructions: str | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    model: str = DEFAULT_MODELS[0]
    lane: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    wrong: WrongInput | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"Step.action must be one of {ACTIONS}, got {self.action!r}")
        if self.form not in (*FORMS, "empty"):
            raise ValueError(f"Step.form must be one of {(*FORMS, 'empty')}, got {self.form!r}")
        if self.wrong is not None and self.wrong not in WRONG_INPUTS:
            raise ValueError(
                f"Step.wrong must be None or one of {WRONG_INPUTS}, got {self.wrong!r}"
            )
        if self.wrong is not None and (not self.generate or self.form == "empty"):
            raise ValueError("a step with wrong input must generate and send input")
        _check_lane(self.lane)
        _check_fields(self.fields)

    def describe(self) -> str:
        """A one-line description for failure messages (tools by name, text shortened)."""
        what = {
            "continue": "continue the latest response",
            "fork": f"fork from response #{self.parent} (modulo)",
            "fresh": "a fresh chain",
            "recover": f"recover response #{self.parent} (modulo) with the full context",
        }[self.action]
        parts = [what if self.generate else what + ", as a warm-up (generate: false)"]
        if self.wrong is not None:
            parts.append(f"WRONG INPUT: {self.wrong.replace('_', ' ')}")
        parts.append(f"lane {self.lane!r}" if self.lane is not None else "default lane")
        text = self.text if len(self.text) <= 40 else self.text[:40] + "…"
        parts.append(f"text {text!r} ({self.form} form)")
        if self.instructions is not None:
            parts.append(f"instructions {_shorten(self.instructions)!r}")
        if self.tools is not None:
            names = [str(tool.get("name", tool.get("type", "?"))) for tool in self.tools]
            parts.append("tools [" + ", ".join(names) + "]")
        parts.append(f"model {self.model!r}")
        if self.fields:
            parts.append("fields " + ", ".join(sorted(self.fields)))
        return "; ".join(parts)


@dataclass(frozen=True)
class Conversation:
    """A program: the steps one socket runs in order, each after the previous one ended."""

    steps: tuple[Step, ...]

    def __len__(self) -> int:
        return len(self.steps)

    def describe(self) -> str:
        """The program, one numbered step a line."""
        return "\n".join(f"  {index}. {step.describe()}" for index, step in enumerate(self.steps))


def conversations(
    *,
    texts: SearchStrategy[str] | None = None,
    instructions: Sequence[str | None] = DEFAULT_INSTRUCTIONS,
    tools: Sequence[Sequence[Mapping[str, Any]] | None] = DEFAULT_TOOLS,
    models: Sequence[str] = DEFAULT_MODELS,
    lanes: Sequence[str | None] = DEFAULT_LANES,
    fields: Sequence[Mapping[str, Any]] = DEFAULT_FIELDS,
    actions: Sequence[Action] = ACTIONS,
    warm_ups: bool = True,
    wrong_inputs: bool = True,
    min_steps: int = 1,
    max_steps: int = 8,
) -> SearchStrategy[Conversation]:
    """A hypothesis strategy of conversation programs.

    Steps continue the latest response (most often), fork from older ones, start fresh chains,
    recover with the full context, and warm up (`generate: false`, unless `warm_ups=False`);
    about one step in ten sends wrong input (unless `wrong_inputs=False`), which the handler
    must refuse over the socket as over HTTP.
    Each step draws its instructions, tools, model, lane and extra fields from the given
    pools, so they change from turn to turn; user messages come in every input form and
    tool calls are answered with function_call_output items. `texts` draws the messages
    (default: 1 to 40 printable characters). Pass your model's name in `models`, the tools
    your handler accepts in `tools`, and `lanes=(None,)` to use the default lane only.
    """
    from hypothesis import strategies as st

    if not models or not all(isinstance(model, str) for model in models):
        raise ValueError("models must be a non-empty sequence of model names")
    for pool, name in ((instructions, "instructions"), (tools, "tools"), (fields, "fields")):
        if not pool:
            raise ValueError(f"{name} must be a non-empty pool (put None in it to omit the field)")
    if not lanes:
        raise ValueError("lanes must be a non-empty pool (None is the default lane)")
    for lane in lanes:
        _check_lane(lane)
    if len({lane for lane in lanes if lane is not None}) > 32:
        raise ValueError("a connection may use at most 32 distinct stream_ids")
    for extra in fields:
        _check_fields(extra)
    if not actions or any(action not in ACTIONS for action in actions):
        raise ValueError(f"actions must be a non-empty subset of {ACTIONS}")
    if not 1 <= min_steps <= max_steps:
        raise ValueError("need 1 <= min_steps <= max_steps")
    if texts is None:
        texts = st.text(
            st.characters(exclude_categories=("Cs", "Cc", "Co")), min_size=1, max_size=40
        )
    # Continuing the latest response is what agents do most; weigh it up.
    weighted = [*(["continue"] * 2 if "continue" in actions else []), *actions]
    tool_pool = [None if tool_set is None else tuple(tool_set) for tool_set in tools]

    @st.composite
    def step(draw: st.DrawFn) -> Step:
        generate = not warm_ups or draw(st.integers(0, 5)) < 5  # shrinks to generating
        forms: Sequence[InputForm] = FORMS if generate else (*FORMS, "empty")
        # Shrinks to right input.
        wrong = wrong_inputs and generate and draw(st.integers(0, 9)) == 9
        return Step(
            action=draw(st.sampled_from(weighted)),
            parent=draw(st.integers(0, max_steps)),
            generate=generate,
            text=draw(texts),
            form=draw(st.sampled_from(forms)),
            instructions=draw(st.sampled_from(list(instructions))),
            tools=draw(st.sampled_from(tool_pool)),
            model=draw(st.sampled_from(list(models))),
            lane=draw(st.sampled_from(list(lanes))),
            fields=dict(draw(st.sampled_from(list(fields)))),
            wrong=draw(st.sampled_from(WRONG_INPUTS)) if wrong else None,
        )

    return st.lists(step(), min_size=min_steps, max_size=max_steps).map(
        lambda steps: Conversation(tuple(steps))
    )


def _check_lane(lane: object) -> None:
    if lane is not None and not (isinstance(lane, str) and STREAM_ID.match(lane)):
        raise ValueError(f"a lane must be None or a valid stream_id, got {lane!r}")


def _check_fields(extra: Mapping[str, Any]) -> None:
    if not isinstance(extra, Mapping):
        raise ValueError(f"fields must be mappings of request fields, got {extra!r}")
    reserved = sorted(set(extra) & _RESERVED_FIELDS)
    if reserved:
        raise ValueError(
            f"fields may not set {', '.join(reserved)}: steps set them (or they are socket-only)"
        )


def _shorten(text: str, limit: int = 30) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
