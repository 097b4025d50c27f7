"""Finding secrets in text before it is stored, and redacting them.

Specific token formats (cloud keys, VCS and chat tokens, private keys, JWTs,
credentials in URLs and connection strings) plus assignments whose name says
"password", "secret", "token" or "api key". Look-alikes that are not secrets
(git SHAs, UUIDs, digests, base64 test data, references such as ``$DB_PASSWORD``
or ``os.environ[...]``) are left alone: nothing here guesses from entropy.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import partial

from memory_mcp.records import Redaction


@dataclass(frozen=True)
class _Pattern:
    kind: str
    regex: re.Pattern[str]
    group: int = 0  # the part to redact; 0 = the whole match


def _p(kind: str, pattern: str, group: int = 0, flags: int = 0) -> _Pattern:
    return _Pattern(kind, re.compile(pattern, flags), group)


_HAS_DIGIT = r"(?=[A-Za-z0-9_\-]*[0-9])"

# Order matters: a more specific pattern claims its text before a generic one.
PATTERNS: tuple[_Pattern, ...] = (
    _p(
        "private-key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    ),
    _p(
        "aws-access-key-id",
        r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA)[A-Z0-9]{16}\b",
    ),
    _p(
        "aws-secret-access-key",
        r"\baws_?secret_?(?:access_?)?key\b[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
        1,
        re.IGNORECASE,
    ),
    _p("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    _p("gitlab-token", r"\bglpat-[A-Za-z0-9_\-]{20,}"),
    _p("slack-webhook", r"https://hooks\.slack\.com/services/[A-Za-z0-9/_\-]{20,}"),
    _p("slack-token", r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),
    _p("stripe-key", r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}\b"),
    _p("anthropic-key", r"\bsk-ant-[A-Za-z0-9_\-]{20,}"),
    _p("openai-key", r"\bsk-(?:proj-|svcacct-|admin-)?" + _HAS_DIGIT + r"[A-Za-z0-9_\-]{20,}"),
    _p("google-api-key", r"\bAIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"),
    _p("npm-token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    _p("huggingface-token", r"\bhf_[A-Za-z0-9]{34,}\b"),
    _p("sendgrid-key", r"\bSG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}(?![A-Za-z0-9_\-])"),
    _p("twilio-key", r"\bSK[0-9a-f]{32}\b"),
    _p("jwt", r"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"),
    _p("url-credentials", r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]+:([^\s@/]+)@", 1),
    _p("connection-string-key", r"\b(?:AccountKey|SharedAccessKey)=([A-Za-z0-9+/=]{20,})", 1, re.I),
    _p("bearer-token", r"\bauthorization\s*:\s*bearer\s+([A-Za-z0-9._~+/\-]{16,}=*)", 1, re.I),
    _p(
        "password-assignment",
        r"\b[A-Za-z0-9_.\-]*(?:password|passwd|pwd|passphrase|secret|api[_\-]?key|apikey|"
        r"access[_\-]?token|auth[_\-]?token|client[_\-]?secret|private[_\-]?key|token)\b[\"']?"
        r"\s*(?:=>|:=|[:=])\s*([\"']?)([^\s\"',;]{6,})\1",
        2,
        re.IGNORECASE,
    ),
)

# Values of an assignment that name a secret without being one.
_REFERENCE = re.compile(
    r"""^(?:
        [$%<{\[]                   # $VAR, ${VAR}, %VAR%, <placeholder>, {{ x }}, [REDACTED]
      | (?:os\.environ|os\.getenv|process\.env|env\(|getenv|secrets\.|vault:|ENV\[)
      | \w+\(                      # a function call: getpass(), read_secret(...)
      | (?:none|null|nil|true|false|required|optional|string|str|undefined)$
      | [x*.\-_]+$                 # xxxxxx, ******, ......
    )""",
    re.IGNORECASE | re.VERBOSE,
)


@dataclass(frozen=True)
class ScanResult:
    text: str
    redactions: list[Redaction]

    @property
    def found(self) -> bool:
        return bool(self.redactions)


def redact(text: str) -> ScanResult:
    """Replace every secret in ``text`` with ``[REDACTED:<kind>]``."""
    counts: Counter[str] = Counter()
    for pattern in PATTERNS:
        text = pattern.regex.sub(partial(_replace, pattern=pattern, counts=counts), text)
    return ScanResult(text, [Redaction(kind, n) for kind, n in sorted(counts.items())])


def _replace(match: re.Match[str], *, pattern: _Pattern, counts: Counter[str]) -> str:
    whole = match.group(0)
    if "[REDACTED:" in whole and pattern.group == 0:
        return whole
    secret = match.group(pattern.group)
    if pattern.kind == "password-assignment" and _REFERENCE.match(secret):
        return whole
    counts[pattern.kind] += 1
    marker = f"[REDACTED:{pattern.kind}]"
    if pattern.group == 0:
        return marker
    start = match.start(pattern.group) - match.start(0)
    end = match.end(pattern.group) - match.start(0)
    return whole[:start] + marker + whole[end:]
