"""The fixed text the reference tokenizer is trained on: English prose, chat turns, Python,
shell and JSON, in the proportions an agent's context holds them. Changing one character of it
changes the token ids, so it is frozen: tests pin its digest."""

from __future__ import annotations

from typing import Final

__all__ = ["CORPUS"]

_PROSE: Final = """\
The assistant reads the request, decides which tool to call, and waits for the result before it
answers. When the weather in Paris is sunny, the answer is short; when the forecast is uncertain,
the assistant looks up the temperature, the wind and the chance of rain, then explains what it
found. A good answer is brief, correct and easy to read. It says what was checked and what was not.

An agent is a loop: the model asks for a tool, the client runs the tool and sends the output back,
and the model continues from the whole conversation. Each turn adds a few items to the history.
Over plain HTTP every request carries the entire history again, so the server parses, validates and
tokenizes the same messages over and over. With a long-lived connection the server keeps the
previous response in memory and the client sends only the new items. The work per turn then
depends on what is new, not on everything that came before.

The user asked for a summary of the file. The assistant opened the file, read the first hundred
lines, searched for the function named parse, and found three places where it is called. The tests
passed after the change. The build failed once because a dependency was missing; after installing
it, the build succeeded. Please review the diff, run the tests again and report any error message.

Questions people ask: What is the weather in London today? How many tokens does this prompt use?
Which version of the library is installed? Where is the configuration file? Why did the request
time out? Can you list the files in this directory? What does this error mean? How do I fix it?
Could you write a function that reads a JSON file and returns the list of users sorted by name?

Answers people expect: The temperature is twenty degrees and the sky is clear. The prompt uses
about four hundred tokens. Version two point three is installed. The configuration lives in the
home directory. The request timed out because the server was busy; retry with a longer timeout.
There are twelve files here, most of them Python modules and a few Markdown documents.

Time, numbers and units: one, two, three, four, five, six, seven, eight, nine, ten, eleven,
twelve, twenty, thirty, forty, fifty, hundred, thousand, million. Monday, Tuesday, Wednesday,
Thursday, Friday, Saturday, Sunday. January, February, March, April, May, June, July, August,
September, October, November, December. Seconds, minutes, hours, days, weeks, months, years.
Bytes, kilobytes, megabytes, gigabytes. Degrees Celsius and Fahrenheit, kilometers and miles.

Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore
et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris nisi ut
aliquip ex ea commodo consequat. Duis aute irure dolor in reprehenderit in voluptate velit esse
cillum dolore eu fugiat nulla pariatur. Lorem ipsum dolor sit amet, consectetur adipiscing elit.

The server streams its answer as events: the response was created, then it is in progress, then an
output item is added, text deltas arrive one after another, the text is done, the item is done, and
finally the response is completed with its usage: input tokens, output tokens and total tokens.
If something goes wrong the server sends an error event with a type, a code, a message and the
parameter that caused it. A client that loses its connection may reconnect and continue from a
stored response, or start again with the full context and no previous response id.
"""

_NOTES: Final = """\
Release notes. This version adds support for streaming responses over a persistent connection,
improves error handling when the network drops, and fixes a bug where large uploads were truncated.
Performance: requests are parsed once, tokens are cached between turns, and memory stays bounded by
configurable limits. Deprecated options still work but print a warning; they will be removed later.
Security: credentials are never logged, headers are filtered, and every connection is authenticated
before the first message is accepted. Documentation was rewritten with examples for each framework.

Meeting notes. Attendees discussed the roadmap, the budget for the next quarter, hiring, customer
feedback and the migration to the new database. Action items: Maria will draft the proposal, Ken
will benchmark the cluster, and Priya will schedule interviews. The deadline moved to next Friday.
Risks include vendor delays, unclear requirements and limited capacity during the holidays.

Recipe. Preheat the oven. Chop the onions, garlic and carrots; fry them gently in olive oil until
soft. Add tomatoes, salt, pepper, basil and a little sugar. Simmer for twenty minutes, stirring
occasionally. Meanwhile boil the pasta in plenty of water. Drain, mix with the sauce and serve hot
with grated cheese. Leftovers keep in the fridge for three days.

Travel. The train leaves the central station at eight in the morning and arrives in Berlin shortly
after noon. Tickets are cheaper when booked early. The hotel is near the river, a short walk from
the museum, the cathedral and the old market square. Breakfast is included; checkout is at eleven.

Science. Water boils at one hundred degrees at sea level. Light travels about three hundred thousand
kilometers per second. Plants convert sunlight, carbon dioxide and water into sugar and oxygen.
The heart pumps blood through arteries and veins; the lungs exchange gases with the air we breathe.
Gravity keeps the planets in orbit around the sun, and the moon causes the tides of the ocean.

Support. Thank you for contacting us. We are sorry about the trouble with your order. Could you
please share the order number, the email address you used, and a screenshot of the problem? Our
team usually replies within one business day. You can also check the status page for outages.
"""

_CHAT: Final = """\
system: You are a helpful assistant. Use the tools when you need facts you do not know.
user: What is the weather in Paris?
assistant: I will look it up.
function_call lookup {"city": "Paris", "units": "metric"}
function_call_output {"temperature": 18, "condition": "cloudy", "wind_kph": 12}
assistant: It is 18 degrees and cloudy in Paris, with a light wind.
user: And tomorrow?
function_call get_forecast {"city": "Paris", "days": 1}
function_call_output {"forecast": [{"day": "tomorrow", "high": 21, "low": 12, "rain": 0.2}]}
assistant: Tomorrow will be warmer, up to 21 degrees, with a small chance of rain.
user: Read the file src/app/main.py and tell me what it does.
function_call read_file {"path": "src/app/main.py"}
function_call_output import sys\\nfrom app.server import run\\n\\nif __name__ == "__main__":
assistant: The file starts the server: it imports run from app.server and calls it.
user: Search the repository for TODO comments.
function_call grep {"pattern": "TODO", "path": ".", "recursive": true}
function_call_output src/app/cache.py:42: # TODO: bound the cache by bytes
assistant: There is one TODO, in src/app/cache.py on line 42, about bounding the cache by bytes.
"""

_PYTHON: Final = '''\
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class Message:
    role: str
    content: str
    metadata: dict[str, Any] = field(default_factory=dict)


class Conversation:
    """A list of messages with helpers to add, find and serialize them."""

    def __init__(self, messages: list[Message] | None = None) -> None:
        self.messages = list(messages or [])

    def __len__(self) -> int:
        return len(self.messages)

    def add(self, role: str, content: str) -> Message:
        message = Message(role=role, content=content)
        self.messages.append(message)
        return message

    def last(self, role: str | None = None) -> Message | None:
        for message in reversed(self.messages):
            if role is None or message.role == role:
                return message
        return None

    def to_json(self) -> str:
        return json.dumps([vars(m) for m in self.messages], sort_keys=True)


def load_users(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        logger.warning("no such file: %s", path)
        return []
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON in {path}: {exc}") from exc
    if not isinstance(data, list):
        raise TypeError(f"expected a list, got {type(data).__name__}")
    return sorted(data, key=lambda user: user["name"])


async def handle(request: Request) -> Response:
    body = await request.json()
    items = body.get("input") or []
    if not isinstance(items, list):
        return JSONResponse({"error": "input must be a list"}, status_code=400)
    total = sum(len(str(item)) for item in items)
    return JSONResponse({"count": len(items), "total": total})


def test_load_users(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text(json.dumps([{"name": "bob"}, {"name": "alice"}]))
    assert [u["name"] for u in load_users(path)] == ["alice", "bob"]
'''

_SHELL: Final = """\
$ git status
On branch main
Changes not staged for commit:
  modified:   src/app/cache.py
$ python -m pytest tests -q
........................................                                 [100%]
40 passed in 1.23s
$ ls -la src/app
total 48
-rw-r--r--  1 user  staff  1024 Mar  3 10:00 __init__.py
-rw-r--r--  1 user  staff  4096 Mar  3 10:00 server.py
$ curl -s http://localhost:8000/healthz
ok
$ pip install -e ".[test]"
Successfully installed app-0.1.0
Traceback (most recent call last):
  File "src/app/server.py", line 12, in <module>
    from app.config import settings
ModuleNotFoundError: No module named 'app.config'
"""

_JSON: Final = """\
{"id": "resp_0123456789abcdef", "object": "response", "status": "completed", "model": "reference",
"output": [{"type": "message", "id": "msg_01", "role": "assistant", "status": "completed",
"content": [{"type": "output_text", "text": "Hello!", "annotations": []}]}],
"usage": {"input_tokens": 120, "output_tokens": 12, "total_tokens": 132}}
{"type": "function_call", "id": "fc_01", "call_id": "call_01", "name": "lookup",
"arguments": "{\\"step\\": 1, \\"context_digest\\": \\"9f86d081884c7d65\\"}", "status": "completed"}
{"type": "function_call_output", "call_id": "call_01", "output": "{\\"ok\\": true}"}
{"type": "response.output_text.delta", "item_id": "msg_01", "output_index": 0,
"content_index": 0, "delta": "Hello", "sequence_number": 4}
{"error": {"type": "invalid_request_error", "code": "previous_response_not_found",
"message": "Previous response with id 'resp_1' not found.", "param": "previous_response_id"}}
{"tools": [{"type": "function", "name": "get_weather", "description": "Get the weather",
"parameters": {"type": "object", "properties": {"city": {"type": "string"}},
"required": ["city"]}}], "instructions": "Be brief.", "stream": true, "store": false}
"""

CORPUS: Final[tuple[str, ...]] = (_PROSE, _NOTES, _CHAT, _PYTHON, _SHELL, _JSON)
"""The training texts, in order."""
