"""Prefix caching of one simulated server, as vLLM / SGLang prefix caching and llama.cpp's
prompt cache behave: a prompt whose beginning was computed recently prefills only the rest.

The model is a radix tree at message granularity. A chat prompt of messages m1..mn has
the boundary prefixes P1 = m1, P2 = m1 m2, ..., Pn; each is a node keyed by a chained
digest and holding the tokens of its own last message. A lookup finds the longest chain
P1..Pk with k < n (the cacheable prefix is everything but the last message, the notion
of `gateway.routing.scorers.affinity.prefix_key`) and returns its tokens, which the
engine then does not prefill. Once a prompt is prefilled, all of P1..Pn are inserted, so
a follow-up turn (the same messages plus the answer and a new question) finds its
predecessor.

Entries are bounded by a token budget and evicted least recently used first. Every touch
of a node also touches its ancestors, after it, so a parent is always more recent than
its children and eviction takes leaves first, as SGLang's radix cache does: no entry is
ever left without the prefix it extends.

Counters follow vLLM's `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits`, in
tokens: every looked-up prompt adds its prompt tokens to `queries`, its cached tokens
to `hits`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import orjson

from gateway.sim.text import message_bytes, text_tokens

__all__ = ["PrefixCache", "PromptChain", "prompt_chain"]


@dataclass(frozen=True, slots=True)
class PromptChain:
    """The boundary prefixes of one chat prompt: a digest and cumulative tokens for each."""

    digests: tuple[bytes, ...]
    tokens: tuple[int, ...]  # tokens[i]: tokens of messages[: i + 1]

    def segment(self, i: int) -> int:
        """Tokens of message i alone, as the tree node of prefix i holds them."""
        return self.tokens[i] - (self.tokens[i - 1] if i else 0)


def prompt_chain(messages: object) -> PromptChain | None:
    """The chain of a chat `messages` list, or None when it is not a non-empty list.

    Token counts are those of `chat_prompt_tokens` (ceil of the text bytes / 4), taken at
    each message boundary, so the last one equals the request's prompt tokens.
    """
    if not isinstance(messages, list) or not messages:
        return None
    digests: list[bytes] = []
    tokens: list[int] = []
    digest = b""
    total_bytes = 0
    for message in messages:
        digest = hashlib.blake2b(digest + orjson.dumps(message), digest_size=16).digest()
        total_bytes += message_bytes(message)
        digests.append(digest)
        tokens.append(text_tokens(total_bytes))
    return PromptChain(tuple(digests), tuple(tokens))


class PrefixCache:
    """The LRU radix cache of one server (see the module docstring)."""

    __slots__ = ("_nodes", "hits", "queries", "tokens")

    def __init__(self) -> None:
        self._nodes: OrderedDict[bytes, int] = OrderedDict()
        self.tokens = 0  # tokens held by all entries
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of those, tokens found cached

    def __len__(self) -> int:
        return len(self._nodes)

    def lookup(self, chain: PromptChain | None, prompt_tokens: int) -> int:
        """Tokens of the longest cached prefix of this prompt (0 when none), counted in
        `queries` and `hits`; the matched entries become the most recently used."""
        self.queries += prompt_tokens
        if chain is None:
            return 0
        nodes = self._nodes
        matched = 0
        for digest in chain.digests[:-1]:
            if digest not in nodes:
                break
            matched += 1
        if not matched:
            return 0
        for digest in reversed(chain.digests[:matched]):
            nodes.move_to_end(digest)
        cached = min(chain.tokens[matched - 1], prompt_tokens)
        self.hits += cached
        return cached

    def insert(self, chain: PromptChain, budget: int) -> None:
        """Cache every prefix of a prompt just prefilled, then evict down to `budget`."""
        nodes = self._nodes
        for i in reversed(range(len(chain.digests))):  # the leaf first, its parents after
            digest = chain.digests[i]
            if digest in nodes:
                nodes.move_to_end(digest)
            else:
                segment = chain.segment(i)
                nodes[digest] = segment
                self.tokens += segment
        self.evict(budget)

    def evict(self, budget: int) -> None:
        """Drop least recently used entries until at most `budget` tokens remain."""
        nodes = self._nodes
        while nodes and self.tokens > budget:
            _, segment = nodes.popitem(last=False)
            self.tokens -= segment
