"""Words: tokenizing, stop words and stemming.

The same tokenizer feeds the lexical search (each backend builds its query from
``query_terms``) and the fold
decision's word-level evidence, so both see one notion of "a word". FTS5
stems with its own Porter tokenizer; ``stem`` is the same algorithm, for the
comparisons done in Python.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

_WORD = re.compile(r"[^\W_]+", re.UNICODE)

STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if
    in into is it its itself just let me more most my myself of off on once only or
    other our ours ourselves out over own same she should so some such than that the
    their theirs them themselves then there these they this those through to too under
    until up very was we were what when where which while who whom why will with would
    you your yours yourself yourselves also get got s t d ll m o re ve y via per not no
    don doesn didn isn aren
    """.split()  # noqa: SIM905
)

_MAX_QUERY_TERMS = 64


def fold_accents(text: str) -> str:
    """Text without combining accents ("café" -> "cafe")."""
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


class Caseless:
    """A pattern matched whatever the case, written in lower case.

    An ASCII text is lower-cased and matched by the pattern as written: 2.7
    times as fast as ``re.IGNORECASE`` (``records.emphasis``: 2.4 against 6.5 us
    a memory of the bench's), with the same matches. Any other text is matched
    with ``re.IGNORECASE`` and its Unicode rules (the long s is an "s" there).
    """

    def __init__(self, pattern: str) -> None:
        self.folded = re.compile(pattern)
        self.unicode = re.compile(pattern, re.IGNORECASE)

    def of(self, text: str) -> tuple[re.Pattern[str], str]:
        """The compiled pattern for ``text``, and the text to give it."""
        if text.isascii():
            return self.folded, text.lower()
        return self.unicode, text

    def search(self, text: str) -> bool:
        pattern, subject = self.of(text)
        return pattern.search(subject) is not None

    def findall(self, text: str) -> list[Any]:
        """``re.findall``'s answer: in lower case for an ASCII text."""
        pattern, subject = self.of(text)
        return pattern.findall(subject)


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters and digits; everything else separates)."""
    return _WORD.findall(fold_accents(text).casefold())


def content_words(text: str) -> list[str]:
    """Words without stop words."""
    return [w for w in words(text) if w not in STOPWORDS]


def query_terms(text: str) -> list[str]:
    """The words a search for ``text`` matches on: its content words, once each."""
    terms = content_words(text) or words(text)
    return list(dict.fromkeys(terms))[:_MAX_QUERY_TERMS]


# Porter stemmer (M. F. Porter, 1980), the algorithm FTS5's "porter" tokenizer uses.

_VOWELS = frozenset("aeiou")


def _forms(word: str) -> str:
    """ "c" or "v" per letter: a y is a vowel after a consonant, a consonant otherwise.

    One pass over the word (a recursion over a run of y's would overflow).
    """
    out: list[str] = []
    for ch in word:
        if ch in _VOWELS:
            out.append("v")
        elif ch == "y":
            out.append("v" if out and out[-1] == "c" else "c")
        else:
            out.append("c")
    return "".join(out)


def _measure(stem: str) -> int:
    return len(re.findall("vc", re.sub(r"(.)\1+", r"\1", _forms(stem))))


def _has_vowel(stem: str) -> bool:
    return "v" in _forms(stem)


def _double_consonant(word: str) -> bool:
    return len(word) >= 2 and word[-1] == word[-2] and _forms(word)[-1] == "c"


def _cvc(word: str) -> bool:
    return len(word) >= 3 and _forms(word)[-3:] == "cvc" and word[-1] not in "wxy"


def _replace(word: str, suffix: str, repl: str, min_measure: int) -> str | None:
    if word.endswith(suffix):
        stem = word[: len(word) - len(suffix)]
        return stem + repl if _measure(stem) > min_measure else word
    return None


_STEP2 = (
    ("ational", "ate"), ("tional", "tion"), ("enci", "ence"), ("anci", "ance"),
    ("izer", "ize"), ("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"),
    ("ousli", "ous"), ("ization", "ize"), ("ation", "ate"), ("ator", "ate"),
    ("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous"),
    ("aliti", "al"), ("iviti", "ive"), ("biliti", "ble"), ("logi", "log"),
)  # fmt: skip
_STEP3 = (
    ("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"),
    ("ful", ""), ("ness", ""),
)  # fmt: skip
_STEP4 = (
    "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent",
    "ion", "ou", "ism", "ate", "iti", "ous", "ive", "ize",
)  # fmt: skip


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The Porter stem of a lower-case word (as FTS5's porter: over 64 letters, as is)."""
    if len(word) <= 2 or len(word) > 64 or not word.isalpha():
        return word
    # Step 1a
    if word.endswith(("sses", "ies")):
        word = word[:-2]
    elif word.endswith("ss"):
        pass
    elif word.endswith("s"):
        word = word[:-1]
    # Step 1b
    extra = False
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    elif word.endswith("ed") and _has_vowel(word[:-2]):
        word, extra = word[:-2], True
    elif word.endswith("ing") and _has_vowel(word[:-3]):
        word, extra = word[:-3], True
    if extra:
        if word.endswith(("at", "bl", "iz")):
            word += "e"
        elif _double_consonant(word) and word[-1] not in "lsz":
            word = word[:-1]
        elif _measure(word) == 1 and _cvc(word):
            word += "e"
    # Step 1c
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    # Step 2 and 3
    for table in (_STEP2, _STEP3):
        for suffix, repl in table:
            replaced = _replace(word, suffix, repl, 0)
            if replaced is not None:
                word = replaced
                break
    # Step 4
    for suffix in _STEP4:
        if word.endswith(suffix):
            stem_ = word[: len(word) - len(suffix)]
            if _measure(stem_) > 1 and (suffix != "ion" or stem_.endswith(("s", "t"))):
                word = stem_
            break
    # Step 5
    if word.endswith("e"):
        stem_ = word[:-1]
        if _measure(stem_) > 1 or (_measure(stem_) == 1 and not _cvc(stem_)):
            word = stem_
    if _measure(word) > 1 and _double_consonant(word) and word.endswith("l"):
        word = word[:-1]
    return word


def stems(text: str, *, keep_stopwords: bool = False) -> list[str]:
    """Stemmed words of ``text`` (stop words dropped unless asked)."""
    tokens = words(text) if keep_stopwords else content_words(text)
    return [stem(t) for t in tokens]
