"""Finding secrets in text, and redacting them.

The rules (``secret_rules``) come in four families, tried in this order:

1. **Token formats**: a provider's own prefix, length and alphabet (``ghp_`` and
   36 characters, ``AKIA`` and 16, PEM blocks, JWTs, ...).
2. **Credentials in structure**: URLs with a password (``redis://:pw@host``),
   connection strings, ``Authorization`` headers, ``curl -u``, signed URLs.
3. **Labels**: assignments whose name says password, secret, token or API key,
   in the syntaxes agents paste (env files, YAML, JSON, TOML, code, XML, CLI
   flags, "the password is ..."). A name that only ends in "key" needs a value
   that looks random.
4. **Neighbours**: an unlabelled random token next to a key id (the 40-character
   AWS secret beside its ``AKIA`` id, a Twilio auth token beside its ``AC`` SID)
   or next to a word such as "token" or "password".

Randomness (``looks_random``: length, character classes, Shannon entropy, no
dictionary-like words, not base64 of plain text) only ever confirms a value a
label, a key id or a secret word points at; nothing is redacted for its entropy
alone. Look-alikes stay: git SHAs, UUIDs, digests, version strings, paths, and
references such as ``$DB_PASSWORD`` or ``${{ secrets.X }}``.

Every rule names the lower-case words (needles) without which it cannot match;
a text is lower-cased once and only the rules whose needles it holds run, so a
text without any of them costs one pass of substring checks.

``FINGERPRINT`` changes whenever the rules do: maintenance re-scans the stored
records when it differs from the one they were last scanned with.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from memory_mcp.records import Record, Redaction
from memory_mcp.secret_rules import LABELS, RULES, RULES_VERSION, Rule

__all__ = ["FINGERPRINT", "ScanResult", "redact", "redact_record", "redact_text"]

MARKER = "[REDACTED:{kind}]"


def _fingerprint(rules: tuple[Rule, ...]) -> str:
    digest = hashlib.sha256()
    for rule in rules:
        digest.update(repr((rule.kind, rule.regex.pattern, rule.regex.flags)).encode())
        digest.update(
            repr((rule.group, rule.needles, getattr(rule.accept, "__name__", None))).encode()
        )
    return f"{RULES_VERSION}:{digest.hexdigest()[:16]}"


FINGERPRINT = _fingerprint(RULES)
"""The rule set's identity: ``RULES_VERSION`` (bumped when a check's code changes)
and a hash of every pattern."""


@dataclass(frozen=True)
class ScanResult:
    text: str
    redactions: list[Redaction]

    @property
    def found(self) -> bool:
        return bool(self.redactions)


def redact(text: str) -> ScanResult:
    """Replace every secret in ``text`` with ``[REDACTED:<kind>]``, counting them by kind."""
    counts: Counter[str] = Counter()
    text = _scan(text, counts)
    return ScanResult(text, [Redaction(kind, n) for kind, n in sorted(counts.items())])


def redact_text(text: str) -> str:
    """``text`` with its secrets redacted (the output path: search hits, the brief)."""
    return _scan(text, None)


def _rules_by_needle(rules: tuple[Rule, ...]) -> dict[str, frozenset[int]]:
    by_needle: dict[str, set[int]] = {}
    for index, rule in enumerate(rules):
        for needle in rule.needles:
            by_needle.setdefault(needle, set()).add(index)
    return {needle: frozenset(indexes) for needle, indexes in by_needle.items()}


_BY_NEEDLE = _rules_by_needle(RULES)
_ALWAYS = frozenset(i for i, rule in enumerate(RULES) if not rule.needles)


# Labelled values ("password: ...") are told by their label and a guess about the value;
# a guess is fine for what is shown or written now, not for rewriting what is stored.
_GUESSES = frozenset(i for i, rule in enumerate(RULES) if rule in LABELS)


def _scan(text: str, counts: Counter[str] | None, *, guesses: bool = True) -> str:
    lowered = text.lower()
    due = set(_ALWAYS)
    for needle, indexes in _BY_NEEDLE.items():
        if needle in lowered:
            due |= indexes
    if not guesses:
        due -= _GUESSES
    for index in sorted(due):  # in the rules' order: the most specific first
        rule = RULES[index]
        text = rule.regex.sub(partial(_replace, rule=rule, counts=counts), text)
    return text


def _replace(match: re.Match[str], *, rule: Rule, counts: Counter[str] | None) -> str:
    start, end = match.span(rule.group)
    whole = match.group(0)
    if start < 0:
        return whole
    secret = match.string[start:end]
    if "[REDACTED" in secret or (rule.accept is not None and not rule.accept(match, secret)):
        return whole
    if counts is not None:
        counts[rule.kind] += 1
    offset = match.start()
    return whole[: start - offset] + MARKER.format(kind=rule.kind) + whole[end - offset :]


def redact_record(record: Record) -> tuple[Record, Counter[str]]:
    """A stored record with its secrets redacted: content, folded texts, and strings in
    meta (earlier texts an LLM rewrote, insight keywords). Returns it and the counts by
    kind; the record itself is returned unchanged when nothing was found.

    Only secrets whose own shape names them (token formats, credentials in URLs and
    headers, a random token beside its key id) are rewritten here: this changes what
    is stored for good, and a labelled value is a guess ("auth: oauth2" is no secret).
    Labelled values are still redacted wherever a record is shown (``redact_text``).
    """
    counts: Counter[str] = Counter()
    content = _scan(record.content, counts, guesses=False)
    merged = [
        replace(m, content=_scan(m.content, counts, guesses=False)) for m in record.merged_from
    ]
    meta = _scan_json(record.meta, counts)
    if not counts:
        return record, counts
    return replace(record, content=content, merged_from=merged, meta=meta), counts


def _scan_json(value: Any, counts: Counter[str]) -> Any:
    if isinstance(value, str):
        return _scan(value, counts, guesses=False)
    if isinstance(value, list):
        return [_scan_json(v, counts) for v in value]
    if isinstance(value, dict):
        return {k: _scan_json(v, counts) for k, v in value.items()}
    return value
