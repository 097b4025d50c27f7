"""Lexical relevance, defined once: Okapi BM25 as SQLite's FTS5 computes it.

The SQLite backend asks FTS5 (``bm25(records_fts, *COLUMN_WEIGHTS)``); a backend
without FTS5 stores each record's ``document_terms`` and computes ``score`` in
SQL, so that the same records rank the same way on either (the contract suite
compares them with ``score`` here).

FTS5's BM25, for a query of phrases q1..qn and a document D::

    score(D) = sum_i idf(qi) * f(qi, D) * (K1 + 1) / (f(qi, D) + K1 * (1 - B + B * |D| / avgdl))
    idf(q) = max(1e-6, ln((N - n(q) + 0.5) / (n(q) + 0.5)))

where ``f`` sums the column weights of each occurrence of the phrase's term, ``|D|``
counts every token of every column (stop words too), ``avgdl`` is the mean of
``|D|`` and ``N`` the number of documents over the whole index (archived records
too), and ``n(q)`` the documents holding ``q``. A word of the query is a
``lexical.query_terms`` term; a token of a document a ``lexical.words`` word;
both are compared by their Porter ``lexical.stem`` (FTS5's ``porter unicode61
remove_diacritics 2`` tokenizer).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from memory_mcp.lexical import stem, words

if TYPE_CHECKING:
    from memory_mcp.storage.base import Filters

K1 = 1.2
B = 0.75
# Weights of the indexed columns: the record's own text, the texts it absorbed by
# folds, its tags.
COLUMN_WEIGHTS = (1.0, 0.8, 0.3)


def indexed_columns(content: str, merged_text: str, tags: Sequence[str]) -> tuple[str, str, str]:
    """The three texts a record is found by, as the full-text index holds them."""
    return content, merged_text, json.dumps(list(tags), ensure_ascii=False)


def document_terms(columns: Sequence[str]) -> tuple[int, dict[str, float]]:
    """A document's length ``|D|`` and the weighted frequency ``f`` of each stem in it."""
    length = 0
    weighted: dict[str, float] = {}
    for text, weight in zip(columns, COLUMN_WEIGHTS, strict=True):
        tokens = words(text)
        length += len(tokens)
        for token in tokens:
            key = stem(token)
            weighted[key] = weighted.get(key, 0.0) + weight
    return length, weighted


def idf(documents: int, holding: int) -> float:
    value = math.log((documents - holding + 0.5) / (holding + 0.5))
    return value if value > 0 else 1e-6


def score(
    query: Sequence[str],
    terms: Mapping[str, float],
    length: int,
    documents: int,
    average_length: float,
    holding: Mapping[str, int],
) -> float:
    """BM25 of one document (``document_terms``) for the query terms ``query``."""
    total = 0.0
    for term in query:
        f = terms.get(stem(term), 0.0)
        norm = K1 * (1 - B + B * length / average_length)
        total += idf(documents, holding.get(stem(term), 0)) * f * (K1 + 1) / (f + norm)
    return total


# The top k without scoring every match ---------------------------------------------
#
# Both backends keep, beside the stems of every record, impact-ordered postings of the
# current ones: per scope and corpus (a "list"), each stem's postings ordered by its
# impact in the record, BM25's frequency part at a fixed reference length. A search
# reads the first ``depth`` postings of its rarest words in each list it may see and
# scores their union exactly (``score``'s formula, the collection's statistics): a word
# held by at most ``depth`` records yields all of them; a common word, its most
# word-dense records. When the filters leave fewer than k, it reads deeper.

REFERENCE_LENGTH = 32.0  # a memory's length in tokens, about: it orders a list only
FIRST_DEPTH = 128  # postings read per word and list in the first round
DEEPER = 4  # how much deeper each further round reads
MOST_FINDERS = 8  # the rarest words of a query that find its candidates


def impact(tf: float, length: int) -> float:
    """A posting's place in its list: BM25's frequency part at the reference length."""
    return tf / (tf + K1 * (1 - B + B * length / REFERENCE_LENGTH))


@dataclass(frozen=True)
class TopPlan:
    """What a lexical top-k query needs: each stem's idf, and the words that find."""

    weights: dict[str, float]  # stem -> idf, for every stem some record holds
    finders: list[str]  # the rarest of them, which find the candidates
    deepest: int  # the most records that hold one of the finders

    @classmethod
    def of(cls, stems: Sequence[str], holding: Mapping[str, int], documents: int) -> TopPlan:
        held = [s for s in dict.fromkeys(stems) if holding.get(s)]
        finders = sorted(held, key=lambda s: holding[s])[:MOST_FINDERS]
        return cls(
            weights={s: idf(documents, holding[s]) for s in held},
            finders=finders,
            deepest=max((holding[s] for s in finders), default=0),
        )


def kept_per_walk(k: int) -> int:
    """How many passing postings a filtered search keeps per word and list (both
    backends' ``narrowed`` walks): as many as the first round reads, or k if more."""
    return max(FIRST_DEPTH, k)


def narrowed(filters: Filters, depth: int, k: int) -> bool:
    """Whether a round at ``depth`` filters its walks' postings before it scores them
    (``narrowed`` top-k queries), rather than scoring every candidate and filtering
    the best.

    Both give the same k while a walk keeps all it reads (``kept_per_walk``): the
    candidates that pass are the same, so are their scores. A kind, a tag, a time
    drops most candidates, which are then not scored; what a reader may see drops
    few, and filtering every posting cost more than it saved (at 50,000 memories,
    warm: a store's rare-word lookup 1.46 against 1.32 ms, a 60-record search 8.8
    against 6.6 ms), so it waits for a deeper round.
    """
    return filters.narrowing or (filters.selective and depth > kept_per_walk(k))


# The write path looks for lexical candidates with a memory's rarest words: its common
# ones matched most of a 50,000-memory project (92 ms of a store).
RARE_TERMS = 8
RARE_POSTINGS = 5_000

COUNTS_TTL = 600.0  # seconds a word's record count is reused
COUNTS_MAX = 100_000  # words remembered at most


class CountCache:
    """How many records hold each word, as read a while ago: what picks a memory's
    rarest words (``rarest``) and weighs its lexical candidates need not be exact.

    Counting a word's records costs as many postings as it has (1-9 ms for a
    memory's words at 50,000 memories, and growing with the store), so a count is
    reused for ``COUNTS_TTL`` seconds; at most ``COUNTS_MAX`` words are kept.
    """

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, float]] = {}  # stem -> (records, when read)

    def forget(self) -> None:
        """Read every count again."""
        self._counts = {}

    def lookup(
        self, stems: Iterable[str], since: float, *, exact: bool = False
    ) -> tuple[dict[str, int], list[str]]:
        """The counts of ``stems`` read after ``since`` (a ``time.monotonic()``) that some
        record held, and the stems to count now: the others, and, unless the cache is
        ``exact`` (nothing written since it was read), those no record held when read
        (a word new to the store is what the next memory on its subject finds it by: a
        zero kept for ten minutes hid a fact from its update written a minute later).
        One look at the cache: a ``forget`` meanwhile changes nothing of the answer."""
        counts = self._counts
        known: dict[str, int] = {}
        missing: list[str] = []
        for s in stems:
            entry = counts.get(s)
            if entry is None or entry[1] < since or not (entry[0] or exact):
                missing.append(s)
            elif entry[0]:
                known[s] = entry[0]
        return known, missing

    def adjust(self, changes: Mapping[str, int]) -> None:
        """Add ``changes`` (records that came to hold a stem, or stopped) to the counts
        kept, each keeping when it was read; one that would fall below zero is dropped
        (counted again when asked)."""
        counts = self._counts
        for s, change in changes.items():
            entry = counts.get(s)
            if entry is None:
                continue
            if entry[0] + change < 0:
                del counts[s]
            else:
                counts[s] = (entry[0] + change, entry[1])

    def remember(self, stems: Iterable[str], found: Mapping[str, int], at: float) -> dict[str, int]:
        """Keep the counts of ``stems`` read at ``at`` (``found``: those some record
        holds); those held. Past ``COUNTS_MAX`` words the cache starts over."""
        if len(self._counts) > COUNTS_MAX:
            self._counts = {}
        counts = self._counts
        held: dict[str, int] = {}
        for s in stems:
            n = int(found.get(s, 0))
            counts[s] = (n, at)
            if n > 0:
                held[s] = n
        return held


def rarest(terms: Sequence[str], held: Mapping[str, int]) -> list[str]:
    """The rarest of ``terms`` by the number of records that hold them (``held``, by stem).

    Up to ``RARE_TERMS`` words, fewer once they match ``RARE_POSTINGS`` records
    together (at least two). Words no record holds match nothing, cost nothing, and
    stay. The counts need not be exact.
    """
    stems = {term: stem(term) for term in terms}
    kept = [t for t in terms if stems[t] not in held]
    known = sorted((t for t in terms if stems[t] in held), key=lambda t: held[stems[t]])
    total = 0
    for count, term in enumerate(known):
        if count >= RARE_TERMS or (count >= 2 and total + held[stems[term]] > RARE_POSTINGS):
            break
        kept.append(term)
        total += held[stems[term]]
    return kept


Row = TypeVar("Row")


def deeper(depth: int, found: int, k: int) -> int:
    """The depth of the round after one at ``depth`` that found ``found`` of ``k`` rows.

    The rows a round finds grow about as its depth: twice as deep when that is
    expected to find k with a quarter to spare (``found`` at least 5/8 of k), else
    ``DEEPER`` times. A tag's search at 200,000 memories found 40-42 of 60 at depth
    128, then read 512 where 256 would find about 80.
    """
    return depth * (2 if 8 * found >= 5 * k else DEEPER)


def next_round(depth: int, found: int, k: int, deepest: int) -> int | None:
    """The depth of the next round after one at ``depth`` found ``found`` rows (``deeper``);
    None: the rounds are over (k rows, or every posting of the finders read)."""
    return None if found >= k or depth >= deepest else deeper(depth, found, k)


def deepest_rows(read: Callable[[int], list[Row]], k: int, deepest: int) -> list[Row]:
    """``read(depth)`` from ``FIRST_DEPTH``, round by round (``next_round``), until it
    gives ``k`` rows or has read every posting of the finders (``deepest``)."""
    depth: int | None = FIRST_DEPTH
    while depth is not None:
        rows = read(depth)
        depth = next_round(depth, len(rows), k, deepest)
    return rows


async def deepening(read: Callable[[int], Awaitable[list[Row]]], k: int, deepest: int) -> list[Row]:
    """``deepest_rows`` with a ``read`` that awaits."""
    depth: int | None = FIRST_DEPTH
    while depth is not None:
        rows = await read(depth)
        depth = next_round(depth, len(rows), k, deepest)
    return rows
