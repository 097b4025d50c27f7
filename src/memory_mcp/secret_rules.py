"""The secret rules ``secret_scan`` applies, most specific first.

Token shapes are written from what the providers document and what the public
rule sets of gitleaks (``config/gitleaks.toml``) and trufflehog
(``pkg/detectors``) record about them: prefixes, lengths, alphabets. Bump
``RULES_VERSION`` when a check's code changes (a pattern change alters the
fingerprint by itself): stored records are then scanned again.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

RULES_VERSION = 2

Accept = Callable[[re.Match[str], str], bool]


@dataclass(frozen=True)
class Rule:
    kind: str
    regex: re.Pattern[str]
    needles: tuple[str, ...]  # lower-case; the rule runs only on a text holding one
    group: int | str = 0  # the part redacted (0: the whole match)
    accept: Accept | None = None  # a check of the secret, with its match, before redacting


# Randomness --------------------------------------------------------------------------

_HEXISH = re.compile(r"[0-9a-f\-]+|[0-9A-F\-]+")  # digests, git SHAs, UUIDs
_PREFIXED_HEX = re.compile(r"[A-Za-z]{1,5}[_\-]?(?:[0-9a-f]{16,}|[0-9A-F]{16,})")  # AC<sid>, ids
# Runs that read like words: "Token", "manager", "DATABASE" (with enough vowels).
_WORD = re.compile(r"[A-Z][a-z]{2,}|[A-Z]{3,}(?![a-z])|(?<![A-Za-z])[a-z]{3,}")
_VOWELS = frozenset("aeiouAEIOU")
_DIGEST_PREFIX = re.compile(r"(?i)sha\d{1,3}[-:]|md5[-:]")


def entropy(text: str) -> float:
    """Shannon entropy in bits per character."""
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values()) if n else 0.0


def looks_random(
    token: str, *, min_len: int = 16, hex_ok: bool = False, words_ok: bool = False
) -> bool:
    """Whether ``token`` looks like a generated secret rather than a word, id or digest.

    Upper case, lower case and a digit or symbol; high entropy; not mostly made
    of word-like runs (``TokenRefreshManager2Impl``; 2% of random 16-character
    tokens look like that too, 0.1% at 40) unless ``words_ok``; not hex unless
    ``hex_ok`` (git SHAs, digests, UUIDs); not base64 of plain text.
    """
    if len(token) < min_len or any(c.isspace() for c in token):
        return False
    if _HEXISH.fullmatch(token):
        return hex_ok and len(token) >= 32 and "-" not in token and entropy(token) >= 3.0
    if _DIGEST_PREFIX.match(token) or _PREFIXED_HEX.fullmatch(token):
        return False
    upper = any(c.isupper() for c in token)
    lower = any(c.islower() for c in token)
    other = any(not c.isalpha() for c in token)
    if not (upper and lower and other):
        return False
    if entropy(token) < (3.3 if len(token) < 24 else 3.7):
        return False
    if not words_ok and _wordy(token):
        return False
    return not _encoded_text(token)


def _wordy(token: str) -> bool:
    words = [w for w in _WORD.findall(token) if sum(c in _VOWELS for c in w) * 4 >= len(w)]
    return sum(len(w) for w in words) >= 0.6 * len(token)


def _encoded_text(token: str) -> bool:
    """Base64 of readable text (test fixtures, encoded prose), which is not a secret."""
    if len(token) < 16 or not re.fullmatch(r"[A-Za-z0-9+/_\-]+=*", token):
        return False
    try:
        padded = token + "=" * (-len(token) % 4)
        urlsafe = "-" in token or "_" in token
        raw = base64.b64decode(padded, altchars=b"-_" if urlsafe else None, validate=True)
        decoded = raw.decode("ascii")
    except (binascii.Error, ValueError):
        return False
    printable = sum(c.isprintable() for c in decoded)
    return " " in decoded and printable >= 0.95 * len(decoded)


# Checks ------------------------------------------------------------------------------

_REFERENCE = re.compile(
    r"""^(?:
        [$%<{\[@]                       # $VAR, ${VAR}, ${{ secrets.X }}, %VAR%, <placeholder>,
                                        # {{ x }}, [REDACTED], @Microsoft.KeyVault(...)
      | (?:os\.environ|os\.getenv|process\.env|import\.meta\.env|getenv|env\(|ENV\[|System\.getenv)
      | (?:secrets|vars|inputs|env|var|local|data|module|self|this|ctx|config|settings|args|opts)\.
      | (?:vault|op|arn|sm|awssm|gcpsm|azkv|ssm|file|env|ref)://?   # secret manager references
      | [A-Za-z_][\w.]*\(               # a function call: getpass(), read_secret(...)
      | [a-zA-Z][a-zA-Z0-9+.\-]*://     # a URL (credentials in it have their own rule)
      | (?:/|~/|\./|\.\./)              # a path
      | [x*.\-_•]+$                     # xxxxxx, ******, ......
      | (?:your|my|some)[_\-]           # your-api-key, my_token
      | [A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$  # another variable's name: DB_PASSWORD
      | [A-Z][a-z]+(?:[A-Z][a-z]+)+$    # a type: SecretStr, PasswordField
      | [A-Z]\w*\[                      # a generic type: Optional[str]
    )""",
    re.VERBOSE,
)
_NOT_SECRETS = frozenset(
    re.split(
        r"\s+",
        """none null nil true false yes no on off required optional string str bytes int
        undefined empty redacted hidden masked unset todo tbd n/a na env vault prompt stdin
        keychain keyring file default auto secret password token""",
    )
)


def _reference(value: str) -> bool:
    return bool(_REFERENCE.match(value)) or value.casefold() in _NOT_SECRETS


def not_reference(match: re.Match[str], value: str) -> bool:
    """Any value but a reference to where the secret lives, or a placeholder."""
    return not _reference(value)


def assigned(match: re.Match[str], value: str) -> bool:
    """A value assigned to a name that says secret, unless it names one or is prose.

    ``password=password`` passes a variable on; ``password: stored in Vault`` is a
    sentence (a lower-case word followed by more words).
    """
    if len(value) < 4 or _reference(value):
        return False
    quoted = match.group("q") is not None
    if not quoted and value.casefold() in (match.group("name").casefold(), _name(match).casefold()):
        return False
    name = match.group("name").casefold()
    if not quoted and value.startswith("-"):
        return False  # a flag: "Pass: --no-verify is banned"
    if not quoted and name in _LOOSE_NAMES and (value.isalpha() or name == "auth"):
        # "credentials:edit", "pass: true", "auth: oauth2": words a value that follows these
        # names often is; an auth token proper looks random.
        return name == "auth" and looks_random(value, min_len=12)
    if not quoted and re.fullmatch(r"[a-z]+_[a-z0-9_]+", value) and _SECRET_WORD.search(value):
        return False  # db_password: a variable
    after = match.string[match.end() : match.end() + 2]
    return quoted or not (value.isalpha() and value.islower() and re.match(r" [A-Za-z]", after))


# Names that are often followed by a plain word rather than a secret.
_LOOSE_NAMES = frozenset({"auth", "pass", "pw", "pwd", "credential", "credentials"})


def said(match: re.Match[str], value: str) -> bool:
    """A value in a sentence ("the password is ..."): it has to look like one, and not
    name one (``gitlab+deploy-token-12`` is the user of a deploy token)."""
    if not assigned(match, value) or len(value) < 6:
        return False
    if _SECRET_WORD.search(value):
        return looks_random(value)
    has_letter = any(c.isalpha() for c in value)
    has_other = any(not c.isalpha() for c in value)
    return (has_letter and has_other) or looks_random(value, min_len=12)


def _name(match: re.Match[str]) -> str:
    """The whole name whose last word the ``name`` group matched: ``DD_APP_KEY``."""
    end = match.end("name")
    start = match.start("name")
    while start > 0 and (match.string[start - 1].isalnum() or match.string[start - 1] in "_.-"):
        start -= 1
    return match.string[start:end]


def random_value(match: re.Match[str], value: str) -> bool:
    """For names that may not be secret (``*_key``): the value must look generated."""
    if "pub" in _name(match).casefold():
        return False  # public keys are meant to be shared
    return looks_random(value, hex_ok=True) and not _reference(value)


def random_token(match: re.Match[str], value: str) -> bool:
    return looks_random(value)


def _within(match: re.Match[str], pattern: re.Pattern[str], before: int, after: int) -> bool:
    """Whether ``pattern`` occurs within ``before``/``after`` characters of the match."""
    text = match.string
    start, end = match.span()
    return bool(
        pattern.search(text, max(0, start - before), start)
        or pattern.search(text, end, min(len(text), end + after))
    )


_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b|\[REDACTED:aws-access-key-id\]")
_TWILIO_SID = re.compile(r"\bAC[0-9a-f]{32}\b|(?i:twilio)")
_SECRET_WORD = re.compile(
    r"(?i)pass(?:word|wd|phrase)|secret|token|cred(?:ential)?s?\b|\bauth\b"
    r"|(?:api|access|private|signing|encryption|master|license|deploy)[ _\-]?key"
)


def near_aws_key_id(match: re.Match[str], value: str) -> bool:
    """The 40-character AWS secret has no label of its own: it goes with its key id."""
    # No word check: AWS's own documented example secret ends in "EXAMPLEKEY".
    return looks_random(value, min_len=40, words_ok=True) and _within(match, _AWS_KEY_ID, 256, 256)


def near_twilio_sid(match: re.Match[str], value: str) -> bool:
    return entropy(value) >= 3.0 and _within(match, _TWILIO_SID, 200, 200)


def near_secret_word(match: re.Match[str], value: str) -> bool:
    """A random token on the same line as "token", "password", "api key", ..."""
    if not looks_random(value):
        return False
    text = match.string
    start, end = match.span()
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    return bool(
        _SECRET_WORD.search(text, max(line_start, start - 80), start)
        or _SECRET_WORD.search(text, end, min(line_end, end + 40))
    )


# Rules -------------------------------------------------------------------------------

_B = r"(?<![A-Za-z0-9_\-])"  # a token starts here
_E = r"(?![A-Za-z0-9_\-])"  # and ends here


def _rule(
    kind: str, pattern: str, needles: str, *, group: int | str = 0, accept: Accept | None = None
) -> Rule:
    """A rule; ``needles`` separated by ``|``."""
    return Rule(kind, re.compile(pattern), tuple(needles.split("|")), group, accept)


# A value: quoted (anything up to the same quote), or bare (up to a space or a
# delimiter or the next query parameter, without the sentence's last full stop or
# a closing bracket).
_VALUE = (
    r"""(?P<q>["'`])?"""
    r"""(?P<v>(?(q)[^\n]{1,256}?(?=(?P=q))|(?:[^\s"'`,;&<>]|&(?![\w.\-]+=)){0,255}[^\s"'`,;&<>.)\]}]))"""
)
_SEP = r"""["'\]]?[ \t]*(?:=>|:=|=|:)[ \t]*"""
_LONG = (
    r"(?:pass(?:word|wd|phrase)|secret[_.\-]?key|secret|token|api[_.\-]?key|apikey|credentials?)"
)
_SHORT = r"(?:pwd|pass|pw|auth)"  # only as a whole part of a name: db_pass, not bypass
# The word that ends a name, found first (a scan from each name's start is 4x slower;
# the look-ahead at its first letter, 2x faster than without).
_NAME = rf"(?=[pastc])(?P<name>(?<![A-Za-z0-9]){_SHORT}|{_LONG})"

TOKENS: tuple[Rule, ...] = (
    _rule(
        "private-key",
        r"-----BEGIN[ A-Z0-9_\-]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]{0,20000}?-----END[ A-Z0-9_\-]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:(?:\s|\\[nr])+[A-Za-z0-9+/=]{16,})+)",
        "private key",
    ),
    _rule(
        "private-key",  # PuTTY: the private lines and their MAC
        r"Private-Lines:[ \t]*\d+"
        r"(?:(?:\s|\\[nr])+(?:Private-MAC:[ \t]*[0-9a-fA-F]+|[A-Za-z0-9+/=]{4,}))+",
        "private-lines",
    ),
    _rule("private-key", r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}", "age-secret"),
    _rule(
        "aws-access-key-id",
        r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",
        "akia|asia|abia|acca",
    ),
    _rule(
        "aws-secret-access-key",
        r"(?i)(?:aws[_.\-]?)?secret[_.\-]?(?:access[_.\-]?)?key"
        + _SEP
        + r"""["']?(?P<v>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])""",
        "secret",
        group="v",
    ),
    _rule(
        "aws-session-token",
        r"(?<![A-Za-z0-9+/])(?:FwoGZXIvYXdz|IQoJb3JpZ2lu)[A-Za-z0-9+/=]{100,}",
        "fwogzxivyxdz|iqojb3jpz2lu",
    ),
    _rule("aws-bedrock-key", _B + r"ABSK[A-Za-z0-9+/]{109,269}={0,2}", "absk"),
    _rule(
        "github-token",
        _B + r"(?:gh[pousr]_[A-Za-z0-9]{36,251}|github_pat_[A-Za-z0-9_]{22,255})" + _E,
        "ghp_|gho_|ghu_|ghs_|ghr_|github_pat_",
    ),
    _rule(
        "gitlab-token",
        _B + r"(?:(?:glpat|gldt|glrt|glcbt|glptt|glft|glimt|glagent|gloas|glsoat|glffct)-"
        r"[A-Za-z0-9_\-]{20,}(?:\.[0-9a-z]{2}\.?[0-9a-z]{7})?|GR1348941[A-Za-z0-9_\-]{20,})" + _E,
        "glpat-|gldt-|glrt-|glcbt-|glptt-|glft-|glimt-|glagent-|gloas-|glsoat-|glffct-|gr1348941",
    ),
    _rule(
        "slack-webhook",
        r"(?:https?://)?hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_\-+]{20,}",
        "hooks.slack.com",
    ),
    _rule(
        "slack-token",
        r"\b(?:xox[abeoprs](?:\.xox[bp])?|xapp)-[A-Za-z0-9\-]{10,}",
        "xox|xapp-",
    ),
    _rule(
        "stripe-key",
        _B + r"(?:(?:sk|rk)_(?:live|test|prod)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9+/=]{24,})" + _E,
        "_live_|_test_|_prod_|whsec_",
    ),
    _rule("anthropic-key", _B + r"sk-ant-[A-Za-z0-9_\-]{20,}", "sk-ant-"),
    _rule(
        "openai-key",  # also sk-proj-, sk-svcacct-, sk-admin-, and OpenAI-compatible hosts
        _B + r"sk-(?:proj-|svcacct-|admin-|or-v1-)?(?=[A-Za-z0-9_\-]*[0-9])[A-Za-z0-9_\-]{20,}",
        "sk-",
    ),
    _rule("groq-key", _B + r"gsk_[A-Za-z0-9]{52}" + _E, "gsk_"),
    _rule("xai-key", _B + r"xai-[A-Za-z0-9_]{80}" + _E, "xai-"),
    _rule("replicate-token", _B + r"r8_[A-Za-z0-9_\-]{37}" + _E, "r8_"),
    _rule("perplexity-key", _B + r"pplx-[A-Za-z0-9]{48}" + _E, "pplx-"),
    _rule("google-api-key", _B + r"AIza[0-9A-Za-z_\-]{35}" + _E, "aiza"),
    _rule(
        "google-oauth-token",
        _B + r"(?:GOCSPX-[A-Za-z0-9_\-]{28}|ya29\.[A-Za-z0-9_\-]{30,}|1//0[A-Za-z0-9_\-]{40,})",
        "gocspx-|ya29.|1//0",
    ),
    _rule(
        "azure-client-secret",
        r"(?<![A-Za-z0-9_~.\-])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}(?![A-Za-z0-9_~.\-])",
        "q~",
    ),
    _rule(
        "azure-container-registry-key",
        r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{42}\+ACR[A-Za-z0-9]{6}\b",
        "+acr",
    ),
    _rule("npm-token", _B + r"npm_[A-Za-z0-9]{36}" + _E, "npm_"),
    _rule("pypi-token", _B + r"pypi-AgE[A-Za-z0-9_\-]{50,}", "pypi-age"),
    _rule("huggingface-token", _B + r"(?:hf_|api_org_)[A-Za-z0-9]{34,}" + _E, "hf_|api_org_"),
    _rule(
        "sendgrid-key",
        _B + r"SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}" + _E,
        "sg.",
    ),
    _rule("twilio-key", r"\bSK[0-9a-fA-F]{32}\b", "sk"),
    _rule(
        "mailgun-key",
        r"\bkey-[0-9a-f]{32}\b|\b[0-9a-f]{32}-[0-9a-f]{8}-[0-9a-f]{8}\b",
        "key-|mailgun",
    ),
    _rule("digitalocean-token", _B + r"do[opr]_v1_[a-f0-9]{64}" + _E, "_v1_"),
    _rule("shopify-token", _B + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _E, "shp"),
    _rule(
        "atlassian-token",
        _B + r"(?:ATATT3|ATCTT3)[A-Za-z0-9_\-=]{150,}",
        "atatt3|atctt3",
    ),
    _rule("heroku-key", _B + r"HRKU-AA[0-9a-zA-Z_\-]{58}" + _E, "hrku-"),
    _rule(
        "discord-webhook",
        r"https://(?:[a-z]+\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]{60,}",
        "discord",
    ),
    _rule(
        "discord-token",
        _B + r"[MNO][A-Za-z0-9_\-]{23,27}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,38}" + _E,
        "discord|token|bot",
        accept=random_token,
    ),
    _rule("telegram-bot-token", r"\b\d{8,10}:AA[A-Za-z0-9_\-]{33}" + _E, ":aa"),
    _rule(
        "doppler-token",
        r"\bdp\.(?:pt|st|sa|ct|scim|audit)\.(?:[a-z0-9\-_]{2,35}\.)?[A-Za-z0-9]{40,44}\b",
        "dp.",
    ),
    _rule("vault-token", r"\bhv[sbr]\.[A-Za-z0-9_\-]{24,}", "hvs.|hvb.|hvr."),
    _rule("databricks-token", r"\bdapi[a-f0-9]{32}(?:-\d)?\b", "dapi"),
    _rule("linear-key", _B + r"lin_(?:api|oauth)_[A-Za-z0-9]{32,64}" + _E, "lin_"),
    _rule(
        "notion-token",
        _B + r"(?:ntn_[0-9]{11}[A-Za-z0-9]{35}|secret_[A-Za-z0-9]{43})" + _E,
        "ntn_|secret_",
    ),
    _rule("postman-key", r"\bPMAK-[a-f0-9]{24}-[a-f0-9]{34}\b", "pmak-"),
    _rule(
        "grafana-token",
        _B + r"(?:glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|glc_[A-Za-z0-9+/]{32,}={0,2})",
        "glsa_|glc_",
    ),
    _rule(
        "sentry-token",
        _B + r"(?:sntryu_[a-f0-9]{64}|sntrys_eyJ[A-Za-z0-9+/=_]{50,})",
        "sntry",
    ),
    _rule(
        "terraform-token",
        r"\b[a-z0-9]{14}\.atlasv1\.[A-Za-z0-9\-_=]{60,70}",
        "atlasv1",
    ),
    _rule("pulumi-token", _B + r"pul-[a-f0-9]{40}" + _E, "pul-"),
    _rule("rubygems-token", _B + r"rubygems_[a-f0-9]{48}" + _E, "rubygems_"),
    _rule("planetscale-token", _B + r"pscale_(?:tkn|oauth|pw)_[\w=.\-]{32,64}", "pscale_"),
    _rule("supabase-token", _B + r"sbp_[a-f0-9]{40}" + _E, "sbp_"),
    _rule(
        "flyio-token",
        _B + r"(?:fo1_[\w\-]{43}|fm[12][ar]?_[A-Za-z0-9+/]{100,}={0,3})",
        "fo1_|fm1|fm2_",
    ),
    _rule("brevo-key", _B + r"xkeysib-[a-f0-9]{64}-[A-Za-z0-9]{16}" + _E, "xkeysib-"),
    _rule("newrelic-key", _B + r"NR(?:AK|II|JS)-[A-Za-z0-9]{19,32}" + _E, "nrak-|nrii-|nrjs-"),
    _rule("1password-token", _B + r"ops_eyJ[A-Za-z0-9+/]{250,}={0,3}", "ops_eyj"),
    _rule("dynatrace-token", r"\bdt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}\b", "dt0c01."),
    _rule("square-token", _B + r"sq0(?:atp|csp)-[\w\-]{22,60}" + _E, "sq0"),
    _rule("artifactory-key", r"\bAKCp[A-Za-z0-9]{69}\b", "akcp"),
    _rule("jwt", r"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}", "eyj"),
)

STRUCTURE: tuple[Rule, ...] = (
    _rule(
        "url-credentials",  # scheme://user:password@host, the user may be empty
        r"(?<![\w+.\-])[a-zA-Z][a-zA-Z0-9+.\-]{0,30}://"
        r"""[^\s:/?#@\[\]"'<>]{0,256}:(?P<v>[^\s/?#"'<>]{1,256})@(?=[\w\[])""",
        "://",
        group="v",
        accept=not_reference,
    ),
    _rule(
        "url-credentials",  # scheme://token@host
        r"(?<![\w+.\-])[a-zA-Z][a-zA-Z0-9+.\-]{0,30}://(?P<v>[A-Za-z0-9_\-]{20,256})@(?=[\w\[])",
        "://",
        group="v",
        accept=random_token,
    ),
    _rule(
        "url-signature",  # SAS, S3 and GCS presigned URLs
        r"(?i)[?&](?:sig|signature|x-amz-signature|x-goog-signature)=(?P<v>[A-Za-z0-9%+/=_\-.]{16,})",
        "sig",
        group="v",
    ),
    _rule(
        "connection-string-key",
        r"(?i)\b(?:AccountKey|SharedAccessKey)\s*=\s*(?P<v>[A-Za-z0-9+/=]{20,})",
        "key",
        group="v",
    ),
    _rule(
        "basic-auth",
        r"""(?i)\bauthorization["']?\s*[:=]\s*["']?\s*basic\s+(?P<v>[A-Za-z0-9+/]{6,}={0,2})""",
        "basic",
        group="v",
        accept=not_reference,
    ),
    _rule(
        "basic-auth",  # curl -u user:password
        r"""\bcurl\b[^\n]{0,300}?\s(?:-u|--user)(?:\s+|=)(?P<q>["']?)[^\s:"']{0,100}:"""
        r"""(?P<v>[^\s"']{1,200})(?P=q)""",
        "curl",
        group="v",
        accept=not_reference,
    ),
    _rule(
        "bearer-token",
        r"""(?i)\bauthorization["']?\s*[:=]\s*["']?\s*(?:bearer|token|bot|apikey|sso-key)\s+"""
        r"(?P<v>[A-Za-z0-9._~+/\-]{8,}=*)",
        "authorization",
        group="v",
        accept=not_reference,
    ),
    _rule(
        "bearer-token",
        r"(?i)\bbearer\s+(?P<v>(?=[A-Za-z0-9._~+/\-]*\d)[A-Za-z0-9._~+/\-]{16,}=*)",
        "bearer",
        group="v",
        accept=not_reference,
    ),
)

LABELS: tuple[Rule, ...] = (
    _rule(
        "password-assignment",  # <password>...</password>
        r"(?i)<(?P<tag>[\w:.\-]{0,40}?" + _LONG + r")>(?P<v>[^<\n]{1,256})</(?P=tag)>",
        "pass|secret|token|key|cred",
        group="v",
        accept=not_reference,
    ),
    _rule(
        "password-assignment",  # <add key="Password" value="..."/>
        r"""(?i)\bkey\s*=\s*["'][\w.:\-]{0,40}?""" + _LONG + r"""["']\s+value\s*=\s*"""
        r"""(?P<q>["'])(?P<v>[^"'\n]{1,256})(?P=q)""",
        "value",
        group="v",
        accept=not_reference,
    ),
    _rule(
        "password-assignment",  # .netrc
        r"(?i)\bmachine\s+\S+(?:\s+login\s+\S+)?\s+password\s+(?P<v>\S+)",
        "machine",
        group="v",
        accept=not_reference,
    ),
    _rule(
        "password-assignment",  # --password x (not -p: too many meanings)
        r"(?i)(?<![\w\-])--?(?P<name>(?:[a-z0-9]+-){0,4}(?:pass(?:word|wd|phrase)|secret|token"
        r"|api-?key))[ \t]+" + _VALUE,
        "pass|secret|token|key",
        group="v",
        accept=assigned,
    ),
    _rule(
        "password-assignment",  # NAME=value, name: value, "name": "value", name => 'value'
        r"(?i)" + _NAME + _SEP + _VALUE,
        "pass|pwd|pw|secret|token|key|auth|cred",
        group="v",
        accept=assigned,
    ),
    _rule(
        "password-assignment",  # app_key = <random>, DD_APP_KEY=..., key: ...
        r"(?i)(?P<name>key)" + _SEP + _VALUE,
        "key",
        group="v",
        accept=random_value,
    ),
    _rule(
        "password-assignment",  # the password for staging is ...
        r"(?i)\b(?P<name>pass(?:word|wd|phrase)|secret|token|api[ _\-]?key)"
        r"(?:\s+(?:for|of|on|to|in|at)(?:\s+[\w.@:/\-]{1,40}){1,3})?"
        r"(?:\s+(?:is|was)\s+|[ \t]*[:=][ \t]*)" + _VALUE,
        "pass|secret|token|key",
        group="v",
        accept=said,
    ),
)

NEIGHBOURS: tuple[Rule, ...] = (
    _rule(
        "aws-secret-access-key",
        r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
        "akia|asia|abia|acca|[redacted:aws-access-key-id]",
        accept=near_aws_key_id,
    ),
    _rule(
        "twilio-auth-token",
        r"(?<![0-9a-fA-F])[0-9a-f]{32}(?![0-9a-fA-F])",
        "twilio|sid",
        accept=near_twilio_sid,
    ),
    _rule(
        "high-entropy-token",
        r"(?<![A-Za-z0-9+/=_\-])[A-Za-z0-9+/_\-]{16,512}={0,2}(?![A-Za-z0-9+/=_\-])",
        "pass|secret|token|cred|key|auth",
        accept=near_secret_word,
    ),
)

RULES: tuple[Rule, ...] = (*TOKENS, *STRUCTURE, *LABELS, *NEIGHBOURS)
