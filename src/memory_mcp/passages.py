"""Splitting a record into the passages that get a vector each.

A record's passages are its own text's, then those of the texts folded into it
(``merged_from``): a fold keeps every source findable.

A long memory mentions many things ("... By the way, I volunteered at the
charity run in June"), and one vector of its first 256 tokens loses most of
them. So a record longer than one passage gets a vector for its whole text
and one per window of sentences; its dense score is the best of them. On the
LongMemEval sample, dense-only search (passages, the ranker and the write
pipeline together) reaches 89.6 session all@5 over the 115 queries where one
plain MiniLM vector per memory gets 84.0 (see the README's Benchmarks).
"""

from __future__ import annotations

import re

MAX_PASSAGES = 64  # whole text + up to 63 windows: the most vectors a backend keeps for a record
_MIN_WINDOW = 60  # characters: shorter sentences join their neighbours
_MAX_WINDOW = 600  # characters: well inside 256 tokens
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")


def split_passages(text: str) -> list[str]:
    """The texts to embed for one record: ``[text]``, or the text then its windows."""
    sentences = [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]
    budget = max(_MIN_WINDOW, len(text) // (MAX_PASSAGES - 1) + 1)
    windows: list[str] = []
    current = ""
    for sentence in sentences:
        for piece in _cut(sentence, max(_MAX_WINDOW, budget)):
            current = f"{current} {piece}".strip()
            if len(current) >= budget:
                windows.append(current)
                current = ""
    if current:
        if windows and len(current) < _MIN_WINDOW // 2:
            windows[-1] = f"{windows[-1]} {current}"
        else:
            windows.append(current)
    if len(windows) <= 1:
        return [text]
    return [text, *windows[: MAX_PASSAGES - 1]]


def _cut(sentence: str, limit: int) -> list[str]:
    """A sentence longer than ``limit`` characters, cut at spaces."""
    if len(sentence) <= limit:
        return [sentence]
    pieces: list[str] = []
    rest = sentence
    while len(rest) > limit:
        cut = rest.rfind(" ", 0, limit)
        cut = cut if cut > limit // 2 else limit
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    if rest:
        pieces.append(rest)
    return pieces


def record_passages(content: str, merged: list[str]) -> list[str]:
    """A record's passages: its own text's, then each folded text's, at most MAX_PASSAGES."""
    passages = split_passages(content)
    for text in merged:
        passages.extend(split_passages(text))
    return passages[:MAX_PASSAGES]
