"""Secrets are redacted before storage; look-alikes are left alone.

Every secret below is made up, but has the real format of its kind. The corpus
(``fixtures/secrets_corpus.jsonl``) holds sentences an agent would store: each
line names the kinds it must report, the secrets that must not survive, and
the text that must (``keep``); a line without kinds must come back unchanged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from memory_mcp.records import MergedEntry, Record
from memory_mcp.secret_scan import FINGERPRINT, redact, redact_record, redact_text

CORPUS_FILE = Path(__file__).parent / "fixtures" / "secrets_corpus.jsonl"
CORPUS: list[dict[str, Any]] = [
    json.loads(line) for line in CORPUS_FILE.read_text(encoding="utf-8").splitlines()
]
POSITIVES = [item for item in CORPUS if item["kinds"]]
NEGATIVES = [item for item in CORPUS if not item["kinds"]]

SECRETS: list[tuple[str, str, str]] = [
    # (kind, text, the secret that must not survive)
    ("aws-access-key-id", "AWS key id is AKIAZ3MPLE7QW9RT4XKV for CI", "AKIAZ3MPLE7QW9RT4XKV"),
    (
        "aws-secret-access-key",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ),
    (
        "github-token",
        "use token ghp_1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ12 for the API",
        "ghp_1a2B3c4D5e6F7g8H9i0JkLmNoPqRsTuVwXyZ12",
    ),
    (
        "github-token",
        "fine-grained: github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF",
    ),
    ("gitlab-token", "GITLAB glpat-Xy9zAbCdEfGhIjKlMnOp here", "glpat-Xy9zAbCdEfGhIjKlMnOp"),
    (
        "slack-token",
        "bot token xoxb-2841922738-4827364521-aBcDeFgHiJkLmNoPqRsTuVwX",
        "xoxb-2841922738-4827364521-aBcDeFgHiJkLmNoPqRsTuVwX",
    ),
    (
        "slack-webhook",
        "alerts go to https://hooks.slack.com/services/T024BE7LD/B01234567/aBcDeFgHiJkLmNoPqRsTuVwX",
        "aBcDeFgHiJkLmNoPqRsTuVwX",
    ),
    (
        "stripe-key",
        "STRIPE_KEY=sk_live_51HxYzAbCdEfGhIjKlMnOpQr in prod",
        "sk_live_51HxYzAbCdEfGhIjKlMnOpQr",
    ),
    (
        "openai-key",
        "OpenAI key sk-proj-4fGh7Jk9Lm2Np5Qr8St1Uv3Wx6Yz0AbCdEf",
        "sk-proj-4fGh7Jk9Lm2Np5Qr8St1Uv3Wx6Yz0AbCdEf",
    ),
    (
        "anthropic-key",
        "ANTHROPIC_API_KEY is sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    ),
    (
        "google-api-key",
        "maps key AIzaSyD3x4mPl3K3yF0rT3st1ng0nly12345678",
        "AIzaSyD3x4mPl3K3yF0rT3st1ng0nly12345678",
    ),
    (
        "private-key",
        "-----BEGIN RSA PRIVATE KEY-----\n"
        "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
        "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n"
        "-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    ),
    (
        "jwt",
        "session eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c sent",
        "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    ),
    (
        "url-credentials",
        "connect to postgres://app:s3cr3t-Passw0rd@db.internal:5432/app",
        "s3cr3t-Passw0rd",
    ),
    (
        "url-credentials",
        "redis URL redis://default:hunter2hunter2@cache:6379/0",
        "hunter2hunter2",
    ),
    ("password-assignment", 'DB_PASSWORD="Tr0ub4dor&3xyz"', "Tr0ub4dor&3xyz"),
    ("password-assignment", "admin password: correcthorse42", "correcthorse42"),
    (
        "password-assignment",
        "api_key: 9f8e7d6c5b4a39281706f5e4d3c2b1a0",
        "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
    ),
    (
        "connection-string-key",
        "DefaultEndpointsProtocol=https;AccountName=acme;AccountKey=Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy==;",
        "Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFy==",
    ),
    (
        "bearer-token",
        "curl -H 'Authorization: Bearer abcDEF123456ghiJKL789mnoPQR' https://api",
        "abcDEF123456ghiJKL789mnoPQR",
    ),
    (
        "npm-token",
        "//registry.npmjs.org/:_authToken=npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    ),
    (
        "huggingface-token",
        "HF token hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
    ),
    (
        "sendgrid-key",
        "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",
        "TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr",
    ),
]

LOOKALIKES = [
    "Fixed in commit 3f2c9a1b7d4e6f8a0b1c2d3e4f5a6b7c8d9e0f1a on main",
    "short sha 3f2c9a1 is the release",
    "request id 123e4567-e89b-12d3-a456-426614174000 failed",
    "fixture payload dGhpcyBpcyBqdXN0IHRlc3QgZGF0YSBmb3IgdGhlIHBhcnNlcg== decodes to text",
    "image digest sha256:9b2a5f0c1d3e4f56789abcdef0123456789abcdef0123456789abcdef012345",
    "npm integrity sha512-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789+/AbCdEfGhIjKlMnOpQrStUvWxYz012345==",
    "The password reset flow sends an email with a one-time link.",
    "Rotate the API key in Vault at secret/ledgerline/prod every 90 days.",
    "password = os.environ['DB_PASSWORD']",
    'api_key: "${API_KEY}"',
    "token = None  # filled in at startup",
    "secret: <your-secret-here>",
    "Use the token bucket algorithm for rate limits (max_tokens = 256).",
    "The scheduler's skip-list lives in sk-scheduler/README.md",
    "connect to postgres://localhost:5432/app without a password",
    "AKIA is the prefix of AWS access key ids.",
]


@pytest.mark.parametrize(
    ("kind", "text", "secret"), SECRETS, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(SECRETS)]
)
def test_secret_is_redacted_and_reported(kind: str, text: str, secret: str) -> None:
    result = redact(text)
    assert secret not in result.text
    assert f"[REDACTED:{kind}]" in result.text
    assert kind in {r.kind for r in result.redactions}


def test_the_corpus_covers_at_least_twelve_kinds_of_secrets() -> None:
    assert len({kind for kind, _, _ in SECRETS}) >= 12


@pytest.mark.parametrize("text", LOOKALIKES)
def test_lookalike_is_left_alone(text: str) -> None:
    result = redact(text)
    assert result.text == text
    assert not result.found


def test_redaction_keeps_the_surrounding_text() -> None:
    result = redact("Deploy with DB_PASSWORD=Sup3rS3cret! and then restart")
    assert result.text == "Deploy with DB_PASSWORD=[REDACTED:password-assignment] and then restart"


def test_several_secrets_are_counted_per_kind() -> None:
    text = "keys AKIAZ3MPLE7QW9RT4XKV and AKIAQ7XW2ERT9YUI0PLM"
    result = redact(text)
    assert [(r.kind, r.count) for r in result.redactions] == [("aws-access-key-id", 2)]


def test_an_unlabelled_aws_secret_next_to_its_key_id_is_redacted() -> None:
    text = "AWS creds for staging: AKIAZ3MPLE7QW9RT4XKV / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    result = redact(text)
    assert result.text == (
        "AWS creds for staging: [REDACTED:aws-access-key-id] / [REDACTED:aws-secret-access-key]"
    )


def test_an_aws_secret_is_redacted_next_to_a_key_id_redacted_before() -> None:
    # What the previous rules stored: the key id redacted, its secret in clear.
    text = "creds: [REDACTED:aws-access-key-id] / wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    assert (
        redact_text(text)
        == "creds: [REDACTED:aws-access-key-id] / [REDACTED:aws-secret-access-key]"
    )


def test_a_password_only_url_is_redacted() -> None:
    result = redact(".env has REDIS_URL=redis://:s3cr3tP4ss@cache:6379")
    assert result.text == ".env has REDIS_URL=redis://:[REDACTED:url-credentials]@cache:6379"


def test_forty_characters_far_from_any_key_id_are_left_alone() -> None:
    text = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY is in the AWS docs"
    assert redact(text).text == text


@pytest.mark.parametrize("item", POSITIVES, ids=lambda item: item["text"][:40])
def test_corpus_secret_is_redacted(item: dict[str, Any]) -> None:
    result = redact(item["text"])
    assert sorted({r.kind for r in result.redactions}) == item["kinds"], result.text
    for secret in item["secrets"]:
        assert secret not in result.text
    for kept in item["keep"]:
        assert kept in result.text
    assert redact(result.text).text == result.text  # redacting twice changes nothing


@pytest.mark.parametrize("item", NEGATIVES, ids=lambda item: item["text"][:40])
def test_corpus_lookalike_is_left_alone(item: dict[str, Any]) -> None:
    assert redact(item["text"]).text == item["text"]


def test_corpus_recall_and_false_positives(capsys: pytest.CaptureFixture[str]) -> None:
    """The corpus's figures (``pytest -s`` prints them): every secret, no look-alike."""
    secrets = caught = 0
    for item in POSITIVES:
        text = redact(item["text"]).text
        secrets += len(item["secrets"])
        caught += sum(secret not in text for secret in item["secrets"])
    flagged = [item["text"] for item in NEGATIVES if redact(item["text"]).found]
    kinds = {kind for item in POSITIVES for kind in item["kinds"]}
    with capsys.disabled():
        print(
            f"\nsecrets corpus: {len(POSITIVES)} lines with {secrets} secrets of {len(kinds)} "
            f"kinds, recall {caught}/{secrets}; {len(NEGATIVES)} look-alikes, "
            f"{len(flagged)} false positives"
        )
    assert caught == secrets and not flagged, flagged
    assert len(POSITIVES) >= 100 and len(NEGATIVES) >= 60 and len(kinds) >= 40


def test_a_record_is_redacted_in_every_text_it_keeps() -> None:
    secret = "redis://:s3cr3tP4ss@cache:6379"
    record = Record(
        id="f_1",
        corpus="facts",
        kind="fact",
        scope="project",
        scope_key="/repo",
        content=f"cache at {secret}",
        agent="a",
        created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:00Z",
        merged_from=[MergedEntry("f_0", f"cache: {secret}", "2026", "a", "2026")],
        meta={"previous_texts": [{"content": f"was {secret}", "by": "llm"}], "path": "a.md"},
    )
    clean, counts = redact_record(record)
    assert counts == {"url-credentials": 3}
    assert "s3cr3tP4ss" not in json.dumps(clean.to_json())
    assert clean.meta["path"] == "a.md" and clean.id == record.id
    assert redact_record(clean) == (clean, {})


def test_the_fingerprint_names_the_rules_version_and_their_patterns() -> None:
    version, digest = FINGERPRINT.split(":")
    assert int(version) >= 2 and len(digest) == 16


def test_redacting_an_ordinary_memory_costs_microseconds() -> None:
    texts = [item["text"] for item in NEGATIVES]
    start = time.perf_counter()
    for _ in range(20):
        for text in texts:
            redact_text(text)
    per_text = (time.perf_counter() - start) / (20 * len(texts))
    assert per_text < 500e-6, f"{per_text * 1e6:.0f} us per text"


def test_a_hostile_text_does_not_make_the_rules_backtrack() -> None:
    for text in ("password=" * 7000, "key: " * 12000, "http://" * 9000, "a" * 64_000):
        start = time.perf_counter()
        redact(text)
        assert time.perf_counter() - start < 2.0
