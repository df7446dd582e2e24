"""How many comparisons LiteLLM's Gemini adapter makes of a hosted chat's tool calls with
the parts before them: bounded before it runs.

LiteLLM 1.108.7's Gemini and Vertex AI adapter takes the system messages out of the
conversation, then merges each run of consecutive assistant messages into one turn,
comparing each tool call with every part of the turn so far (text, reasoning, images,
calls) to drop a repeated one (`check_if_part_exists_in_parts`): n calls of distinct
names in one message are n**2 / 2 comparisons, and so are n messages of one call each,
one after another or each after a system message. 8,000 in one message (a 700 KB body)
held the gateway's CPU 9 s; 16,000 messages of one, each after a system one, 58 s; an
8 MB body's 100,000 would hold it for most of an hour. `run_parts` counts them, all runs
of the conversation together, generously (every part of a message, its own calls
included, before each of its calls), for every provider; past `MAX_RUN_COMPARISONS`,
`check_messages` refuses the request (gateway/upstream/openai_messages.py).
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["MAX_RUN_COMPARISONS", "TOO_MANY_COMPARISONS", "run_parts"]

MAX_RUN_COMPARISONS: Final = 1 << 20
"""Tool calls times the parts before them in their run: some 0.3 s of the adapter's time; a
turn of a hundred calls is 10,000, one of a thousand parallel calls 1,000,000."""
TOO_MANY_COMPARISONS: Final = (
    f"at most {MAX_RUN_COMPARISONS} tool calls times the parts of the run of assistant "
    "messages they are in (a provider's adapter compares each call with the parts before it)"
)
# Roles that end no run of assistant messages (the adapter takes system messages out first;
# LiteLLM makes a developer message a system one).
_IN_RUNS: Final = frozenset({"assistant", "system", "developer"})


def run_parts(role: str, message: dict[str, Any], run: int, compared: int) -> tuple[int, int]:
    """`run` (the parts of the current run of assistant messages) and `compared` (the
    comparisons counted so far) once `message`, of `role`, is read: an assistant message's
    parts join the run, each of its calls compared with every part of the run, its own
    included; a message of another role ends the run, but for a system or developer one."""
    if role != "assistant":
        return run if role in _IN_RUNS else 0, compared
    content, images = message.get("content"), message.get("images")
    parts = len(content) if isinstance(content, list) else int(content is not None)
    parts += (len(images) if isinstance(images, list) else 0) + ("reasoning_content" in message)
    tool_calls = message.get("tool_calls")
    made = len(tool_calls) if isinstance(tool_calls, list) and tool_calls else 0
    made = made or message.get("function_call") is not None
    return run + parts + made, compared + made * (run + parts + made)
