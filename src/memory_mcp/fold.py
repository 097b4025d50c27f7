"""The fold decision: is a new fact a duplicate, an update, a contradiction, or new?

Dense similarity alone cannot tell: an update ("minimum iOS 15" -> "16") or a
contradiction ("run with -x" -> "never run with -x") is *closer* in embedding
space than a true paraphrase. So the decision looks at what differs between
the two texts:

- **values** - numbers, versions, paths, hosts, identifiers, flags, names: a
  value present only in the old text and another only in the new one means the
  subject's value changed (supersede);
- **polarity** - negations and antonyms (never/always, enabled/disabled,
  allowed/forbidden ...) present on one side only mean a contradiction
  (conflict) - a negation only when the texts share more than a third of
  their words, as a contradiction restates what it negates;
- **order** - the same words in a different order can swap roles ("A acquired
  B" / "B acquired A"), so a reordered near-copy is not folded;
- **change cues** - "renamed", "moved to", "upgraded", "now" ... in the new text
  mark an update even when the old value is not restated.

Similarity (dense cosine, or word overlap on the BM25 floor) only says whether
the two are about the same subject and how close the wording is. Thresholds
are relative to the embedder and live in ``FoldSettings``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Literal

from memory_mcp.config import FoldSettings
from memory_mcp.lexical import STOPWORDS, Caseless, fold_accents, stem, words
from memory_mcp.records import normalized_text

FoldAction = Literal["fold", "supersede", "conflict", "insert"]

# Word overlap from which two texts count as near-copies of each other.
_NEAR_COPY = 0.6
_ALIGN_MAX = 400
_NOVEL_WORDS = 10  # content words one side has and the other lacks
# Texts sharing less than a quarter of their words, each saying this many things the
# other does not, are two statements however close in embedding space (two turns
# of one conversation: "Wow, the colours blend nicely!" / "Is this your own
# painting?"). On the visible coding-agent pairs this blocks 1 of 21 true folds.
_FEW_NOVEL_WORDS = 6
_LOW_OVERLAP = 0.25
# A negation on one side is a contradiction only when the texts share more than
# this much of their words: a contradiction restates what it negates, while a
# loose paraphrase may word the same rule with a negation ("dislikes emojis" /
# "no emoji"). On the fold pairs, this turned 4 of 8 false conflicts between
# duplicates into folds and kept all 26 true ones, in both halves of the file.
_RESTATES = 1 / 3

# Negation cues, matched on raw lower-cased text (contractions included).
_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nor|cannot|can't|won't|don't|doesn't|didn't|isn't|aren't|"
    r"wasn't|weren't|shouldn't|mustn't|hasn't|haven't|without|no\s+longer|neither)\b"
    r"|n't\b"
)

# Pairs of opposite words (stems); one on each side is a contradiction.
_ANTONYMS: tuple[tuple[frozenset[str], frozenset[str]], ...] = tuple(
    (frozenset(stem(w) for w in pos.split()), frozenset(stem(w) for w in neg.split()))
    for pos, neg in (
        ("enabled enable on", "disabled disable off"),
        ("true", "false"),
        (
            "allowed allow permitted acceptable fine ok may",
            "forbidden banned disallowed prohibited avoid",
        ),
        ("public", "private"),
        ("safe", "unsafe dangerous"),
        ("always", "never"),
        ("works work", "breaks break broken"),
        ("accepts accept", "rejects reject"),
        ("soft", "hard"),
        ("sync synchronous", "async asynchronous"),
        ("include includes", "exclude excludes"),
        ("liberal detailed", "minimal"),
        ("required mandatory", "optional"),
        ("preferred prefer", "forbidden avoid"),
        ("supports support", "lacks"),
        ("deleted delete removed remove", "kept keep retained retain"),
    )
)

# "Use pnpm, not npm" says what "use pnpm rather than npm" says: the "not" of a
# contrast rejects the alternative, it does not negate the statement.
_CONTRAST_NOT = r"(?:,|\bbut)\s+not"
_CONTRAST = Caseless(rf"{_CONTRAST_NOT}\s+(?=\S)")
# What a contrast rejects: the words after ", not", "but not", "rather than", "instead of".
_REJECTED = Caseless(rf"(?:{_CONTRAST_NOT}|\brather\s+than|\binstead\s+of)\s+([^,;.()]{{1,40}})")

_CHANGE_CUE = Caseless(
    r"\b(?:renamed|moved|migrated|switched|upgraded|downgraded|replaced|raised|lowered|"
    r"increased|decreased|changed|bumped|took\s+over|now|no\s+longer|since|deprecated|"
    r"decommissioned|from\s+\S+\s+to)\b",
)

# Value-like tokens: what a fact's subject is set to, by kind, each with what a text
# must hold for a token of that kind to be in it.
_DIGIT = re.compile(r"\d")
_UPPER = re.compile(r"[A-Z]")
VALUE_KINDS: tuple[tuple[str, Callable[[str], object]], ...] = (
    (r"`[^`]+`", lambda t: "`" in t),  # code spans
    (r"\b[a-z][a-z0-9+.\-]*://\S+", lambda t: "://" in t),  # URLs
    (r"(?<![\w@])@[\w\-./]+", lambda t: "@" in t),  # @handles, @scope/packages
    (r"(?<![\w-])--?[a-zA-Z][\w\-]*(?:=\S+)?", lambda t: "-" in t),  # flags
    (r"[~.]?[\w\-.]*/[\w\-./<>*]+", lambda t: "/" in t),  # paths
    (r"\b\w+(?:\.\w+)+\b", lambda t: "." in t),  # dotted names: hosts, files, versions
    (r"\b\d[\d,.:]*(?:[a-zA-Z%]{1,3})?\b", _DIGIT.search),  # numbers, short units (512Mi, 85%)
    (r"\b[a-z]+_[a-z0-9_]+\b", lambda t: "_" in t),  # snake_case identifiers
    (r"\b[a-z]+[A-Z]\w*\b", _UPPER.search),  # camelCase
    (r"\b[A-Z][a-zA-Z0-9]*[A-Z0-9]\w*\b", _UPPER.search),  # CamelCase, ALLCAPS, PascalCase
    (r"(?<=[\w,;)] )[A-Z][a-z]+\b", _UPPER.search),  # capitalized words inside a sentence: names
)


@cache
def _value_pattern(kinds: tuple[bool, ...]) -> re.Pattern[str]:
    """The alternation of the value kinds flagged, in their order (none: no match)."""
    return re.compile(
        "|".join(p for (p, _), on in zip(VALUE_KINDS, kinds, strict=True) if on) or "(?!)"
    )


def _value_tokens(text: str) -> Iterator[re.Match[str]]:
    """The value-like tokens of ``text``: those of the alternation of every kind, from
    the alternation of the kinds whose character the text holds. A kind that cannot
    match anywhere cannot take a position from another, so the tokens are the same;
    the regular expression tries fewer alternatives at each position: 25.8 -> 20.0 us
    a memory of the bench's (3,000 of them), more where a text has no path or flag.
    """
    return _value_pattern(tuple(bool(can(text)) for _, can in VALUE_KINDS)).finditer(text)


# A transcript's turn: "Caroline: ..." (a name, then a colon and a space).
_SPEAKER = re.compile(r"\s*([A-Z][\w'-]*(?: [A-Z][\w'-]*)?):\s")
_ONE_UNIT = Caseless(
    r"\b(?:every|each|per|once\s+an?|an?)\s+(?:second|minute|hour|day|week|month|year)\b",
)
# Short all-caps words are vocabulary (CI, PR, ORM, UTC), not values.
_ACRONYM = re.compile(r"^[a-z]{2,4}s?$")
_NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
    "seven": "7", "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12",
    "fifteen": "15", "twenty": "20", "thirty": "30", "forty": "40", "fifty": "50",
    "sixty": "60", "hundred": "100", "thousand": "1000", "single": "1", "once": "1",
    "twice": "2", "pair": "2", "couple": "2", "dozen": "12", "half": "0.5",
}  # fmt: skip


def _value_key(token: str) -> str:
    """A value in comparable form: no backticks, quotes, trailing punctuation or case."""
    text = token.strip("`'\".,;:()[]").casefold()
    return text.rstrip("/")


def values(text: str) -> frozenset[str]:
    """Value-like tokens of ``text``, in comparable form."""
    found: set[str] = set()
    for match in _value_tokens(text):
        token = match.group(0)
        key = _value_key(token)
        if not key or key in STOPWORDS:
            continue
        if token.isupper() and _ACRONYM.match(key):
            continue
        found.add(key)
    for word in words(text):
        if word in _NUMBER_WORDS:
            found.add(_NUMBER_WORDS[word])
    if _ONE_UNIT.search(text):
        found.add("1")  # "every minute" is one minute: "every 3 minutes" changes it
    return frozenset(found)


def _plain(text: str) -> str:
    return " ".join(fold_accents(text).casefold().replace("`", " ").split())


_ATOM = re.compile(r"[a-z]+|[0-9]+")
_QUANTITY = re.compile(r"^(\d+)(?:[a-z%]{0,3})$")


def _unpadded(number: str) -> str:
    """A run of digits without its leading zeros ("007" is "7", "000" is "0")."""
    return number.lstrip("0") or "0"


def _atoms(value: str) -> frozenset[str]:
    """Letter and digit runs of a value, numbers without leading zeros."""
    return frozenset(_unpadded(a) if a.isdigit() else a for a in _ATOM.findall(value))


def _number_words(plain: str) -> frozenset[str]:
    """A text's letter and digit runs, and its numbers without leading zeros too."""
    runs = set(_ATOM.findall(plain))
    return frozenset(runs | {_unpadded(a) for a in runs if a.isdigit()})


def _unmatched(side: _Text, other: _Text) -> frozenset[str]:
    """Values of ``side`` that the other text does not state.

    A value is stated when the other side has it, spelled the same, split over
    several of its values ("`~/.config/harbor/config.toml`" / "config.toml under
    ~/.config/harbor") or spelled out in its words. It is not stated when the
    other side has a different value in the same slot: one with more or fewer
    parts ("db/migrations" / "src/db/migrations"), or sharing some parts but
    not all ("acme-web" / "acme-frontend").
    """
    other_words, plain = other.plain_words, other.plain
    other_atoms, side_atoms = other.value_atoms, side.value_atoms
    missing = set()
    for value, atoms in side_atoms.items():
        if value in other_atoms:
            continue
        quantity = _QUANTITY.match(value)
        if quantity:
            # 512Mi / 512 MiB, 5-second / 5s: the number is the value, units are wording.
            if _unpadded(quantity.group(1)) not in other_words:
                missing.add(value)
            continue
        if _standalone(value, plain):
            continue  # written out in full on the other side
        if _split_over(atoms, [a for a in other_atoms.values() if a < atoms]):
            continue  # this value, written as several values on the other side
        if any(
            atoms < w and _split_over(w, [a for a in side_atoms.values() if a < w])
            for w in other_atoms.values()
        ):
            continue  # part of an other-side value that this side splits up
        nested = any(atoms < w or w < atoms for w in other_atoms.values())
        clash = any(atoms & w and not (atoms <= w or w <= atoms) for w in other_atoms.values())
        if nested or clash:
            missing.add(value)
            continue
        present = sum(1 for a in atoms if a in other_words)
        if not atoms or present * 3 < len(atoms) * 2:
            missing.add(value)
    return frozenset(missing)


def _standalone(value: str, text: str) -> bool:
    """Whether ``value`` occurs in ``text`` on its own, not inside a longer path or name."""
    start = text.find(value)
    while start >= 0:
        end = start + len(value)
        before = text[start - 1] if start > 0 else " "
        after = text[end] if end < len(text) else " "
        if not (_JOINER.match(before) or (_JOINER.match(after) and after not in ".,;:")):
            return True
        start = text.find(value, start + 1)
    return False


_JOINER = re.compile(r"[\w/\\~\-.:@]")


def _split_over(whole: frozenset[str], parts: list[frozenset[str]]) -> bool:
    """Whether at least two smaller values together make up ``whole``."""
    return len(parts) >= 2 and frozenset().union(*parts) == whole


def _without_contrast(text: str) -> str:
    """The text with the "not" of each contrast (", not X", "but not X") left out, and
    lower-cased if it is ASCII (``Caseless``): for ``polarity``, which folds case."""
    pattern, subject = _CONTRAST.of(text)
    return pattern.sub(" ", subject)


def polarity(text: str) -> int:
    """How many negation cues ``text`` has."""
    return len(_NEGATION.findall(fold_accents(text).casefold().replace("\u2019", "'")))


def _content_stems(text: str) -> list[str]:
    return [stem(w) for w in words(text) if w not in STOPWORDS]


def _disorder(old: list[str], new: list[str]) -> int:
    """Shared words that cannot be aligned in order: |common multiset| - LCS.

    Zero when the words both texts share appear in the same order; a swap of
    two names ("born in A, grew up in B" / "born in B, grew up in A") leaves
    at least one shared word unaligned.
    """
    common = sum((Counter(old) & Counter(new)).values())
    if common == 0:
        return 0
    return common - lcs_length(old, new)


def lcs_length(old: Sequence[str], new: Sequence[str]) -> int:
    """The length of the longest common subsequence of two word sequences.

    Bit-parallel (Allison and Dix; Hyyrö 2004): one bit per word of ``new``, a
    few integer operations per word of ``old``, where the dynamic programme
    took len(old) x len(new) steps (0.18 ms a near-copy pair in a store).
    """
    where: dict[str, int] = {}
    for at, word in enumerate(new):
        where[word] = where.get(word, 0) | (1 << at)
    width = (1 << len(new)) - 1
    v = width
    for word in old:
        u = v & where.get(word, 0)
        v = ((v + u) | (v - u)) & width
    return len(new) - v.bit_count()


@dataclass(frozen=True)
class Evidence:
    """What differs between an existing record (old) and a new text."""

    similarity: float  # dense cosine, or word overlap on the lexical floor
    dense: bool
    exact: bool
    overlap: float  # Jaccard of content stems
    old_only_values: frozenset[str]
    new_only_values: frozenset[str]
    old_only_words: frozenset[str]  # content stems, values excluded
    new_only_words: frozenset[str]
    polarity_flip: bool
    antonym: bool
    disorder: int
    change_cue: bool
    speakers_differ: bool = False  # "Ann: ..." / "Bob: ...": two people's statements


@dataclass(frozen=True)
class _Text:
    """What the decision needs from one text, computed once per text."""

    stems: tuple[str, ...]
    stem_set: frozenset[str]
    all_stems: frozenset[str]  # stop words included: "on" / "off" are opposites here
    values: frozenset[str]
    value_atoms: dict[str, frozenset[str]]  # each value's letter and digit runs
    value_words: frozenset[str]  # the stems of the values' words
    plain: str
    plain_words: frozenset[str]  # ``_number_words`` of ``plain``
    normalized: str
    negated: bool
    change_cue: bool
    speaker: str | None  # "Ann" of "Ann: ...", a transcript's turn
    rejected: frozenset[str]  # content stems a contrast rejects ("X, not Y": Y)


# The texts a store or a maintenance sweep compares come back within the same store
# (a new text against each neighbour, each neighbour's stems then its analysis), seldom
# across stores: over 300 stores at 50,000 memories, 128 analyses kept gave 395 of the
# 414 hits 4,096 gave. An analysis holds about 7-8 KB: 4,096 of them were 34 MB of a
# server's memory once a consolidation sweep had filled them.
@lru_cache(maxsize=1024)
def _stems(text: str) -> tuple[str, ...]:
    return tuple(_content_stems(text))


@lru_cache(maxsize=512)
def _analyse(text: str) -> _Text:
    stems = _stems(text)
    found = values(text)
    plain = _plain(text)
    return _Text(
        stems=stems,
        stem_set=frozenset(stems),
        all_stems=frozenset(stem(w) for w in words(text)),
        values=found,
        value_atoms={v: _atoms(v) for v in found},
        value_words=frozenset(stem(w) for v in found for w in words(v)),
        plain=plain,
        plain_words=_number_words(plain),
        normalized=normalized_text(text),
        negated=polarity(_without_contrast(text)) > 0,
        change_cue=_CHANGE_CUE.search(text),
        speaker=speaker.group(1).casefold() if (speaker := _SPEAKER.match(text)) else None,
        rejected=frozenset(
            stem(w)
            for phrase in _REJECTED.findall(text)
            for w in words(phrase)[:3]
            if w not in STOPWORDS
        ),
    )


def compare(old: str, new: str, similarity: float | None = None) -> Evidence:
    """Collect the evidence for ``decide``.

    Args:
        old: the stored record's text.
        new: the text being written.
        similarity: dense cosine between the two, when both have vectors.
    """
    a, b = _analyse(old), _analyse(new)
    union = a.stem_set | b.stem_set
    overlap = len(a.stem_set & b.stem_set) / len(union) if union else 1.0
    only_old, only_new = a.stem_set - b.stem_set, b.stem_set - a.stem_set
    value_words = a.value_words | b.value_words
    # Opposites are looked for among all words: "on" / "off" are stop words to search.
    all_old, all_new = a.all_stems - b.all_stems, b.all_stems - a.all_stems
    antonym = any(
        (pos & all_old and neg & all_new) or (neg & all_old and pos & all_new)
        for pos, neg in _ANTONYMS
    )
    # One side rejects what the other states ("timestamps in UTC" / "local time, not
    # UTC"); both rejecting it ("pnpm, not npm" / "pnpm rather than npm") agree.
    antonym = antonym or bool(
        (a.rejected & (b.stem_set - b.rejected)) or (b.rejected & (a.stem_set - a.rejected))
    )
    return Evidence(
        similarity=overlap if similarity is None else similarity,
        dense=similarity is not None,
        exact=a.normalized == b.normalized,
        overlap=overlap,
        old_only_values=_unmatched(a, b),
        new_only_values=_unmatched(b, a),
        old_only_words=frozenset(only_old - value_words),
        new_only_words=frozenset(only_new - value_words),
        polarity_flip=a.negated != b.negated,
        antonym=antonym,
        # Order only matters for near-copies; bounded, as the alignment is quadratic.
        disorder=(
            _disorder(list(a.stems[:_ALIGN_MAX]), list(b.stems[:_ALIGN_MAX]))
            if overlap >= _NEAR_COPY
            else 0
        ),
        change_cue=b.change_cue and not a.change_cue,
        speakers_differ=a.speaker is not None and b.speaker is not None and a.speaker != b.speaker,
    )


@dataclass(frozen=True)
class Decision:
    action: FoldAction
    reason: str


def judge(old: str, new: str, similarity: float | None, settings: FoldSettings) -> Decision:
    """``decide(compare(old, new, similarity))``, answered from the two texts' words alone
    when they are not about the same subject (``decide``'s first test), as most of a
    new memory's neighbours are not: the rest of the evidence (values, polarity,
    order) costs 0.05 ms a pair."""
    a, b = set(_stems(old)), set(_stems(new))
    union = a | b
    overlap = len(a & b) / len(union) if union else 1.0
    close = similarity is not None and similarity >= settings.dense_subject
    if overlap < settings.lexical_subject and not close:
        return Decision("insert", "different subject")
    return decide(compare(old, new, similarity), settings)


def decide(ev: Evidence, settings: FoldSettings) -> Decision:
    """Fold, supersede, conflict or insert, from the evidence."""
    if ev.exact:
        return Decision("fold", "exact repeat")
    threshold = settings.dense_threshold if ev.dense else settings.lexical_threshold
    # Same subject: close in meaning, or sharing most words (a negation can push
    # two short texts apart in embedding space while their words stay the same).
    same_subject = ev.overlap >= settings.lexical_subject or (
        ev.dense and ev.similarity >= settings.dense_subject
    )
    if not same_subject:
        return Decision("insert", "different subject")
    if ev.speakers_differ:
        return Decision("insert", "said by different people")
    # A fact restated, updated or contradicted shares most of its words; texts that
    # each say many things the other does not are different memories, however
    # close in embedding space (two turns of one conversation).
    novel = max(len(ev.old_only_words), len(ev.new_only_words))
    if novel > _NOVEL_WORDS or (novel >= _FEW_NOVEL_WORDS and ev.overlap < _LOW_OVERLAP):
        return Decision("insert", "different statements")
    if ev.antonym or (ev.polarity_flip and ev.overlap > _RESTATES):
        return Decision("conflict", "same subject, opposite statement")
    changed = bool(ev.old_only_values and ev.new_only_values)
    # Other words changed on both sides too: another attribute of the subject
    # ("worker concurrency is 8" / "worker prefetch multiplier is 1"), not an update.
    other_attribute = bool(ev.old_only_words and ev.new_only_words)
    # Several values changed at once: another subject with its own values
    # ("service A on port 8000" / "service B on port 8001"), not an update.
    several = len(ev.old_only_values) >= 2 and len(ev.new_only_values) >= 2
    if several:
        return Decision("insert", "another subject with its own values")
    if ev.change_cue and (ev.old_only_values or ev.new_only_values):
        return Decision("supersede", "same subject, changed value")
    if changed and not other_attribute:
        return Decision("supersede", "same subject, changed value")
    if changed:
        return Decision("insert", "same subject, another attribute")
    # A near-copy whose shared words moved may have swapped roles ("A acquired B").
    swapped = ev.disorder > 0 and ev.overlap >= _NEAR_COPY
    if ev.similarity >= threshold and not swapped:
        return Decision("fold", "same fact reworded")
    return Decision("insert", "related but different")
