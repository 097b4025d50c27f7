"""The fold decision, from the evidence of what differs between two texts."""

from __future__ import annotations

import re

import pytest

from memory_mcp import fold
from memory_mcp.config import FoldSettings
from memory_mcp.fold import compare, decide, polarity, values
from memory_mcp.lexical import Caseless

SETTINGS = FoldSettings()


def action(old: str, new: str, similarity: float | None) -> str:
    return decide(compare(old, new, similarity), SETTINGS).action


@pytest.mark.parametrize(
    ("old", "new", "similarity", "expected"),
    [
        # The issue's own examples, with MiniLM's cosine for each pair.
        (
            "We deploy with GitHub Actions to Fly.io",
            "Deploys to production go out via GitHub Actions onto Fly.io",
            0.89,
            "fold",
        ),
        (
            "The pigeon app's minimum iOS version is 15.",
            "The pigeon app's minimum iOS version is 16.",
            0.98,
            "supersede",
        ),
        ("Run tests with pytest -x", "Never run tests with -x", 0.52, "conflict"),
        # Updates: a value changed, or the new text says it changed.
        ("Database migrations live in `db/migrations`.",
         "Database migrations live in `src/db/migrations` after the restructure.",
         0.90, "supersede"),
        ("Frontend errors report to the Sentry project `acme-web`.",
         "Frontend errors report to the Sentry project `acme-frontend`.", 0.96, "supersede"),
        ("The CLI binary is called `harbor`.",
         "The CLI binary was renamed from `harbor` to `hbr`.", 0.80, "supersede"),
        ("beacon pods have a memory limit of 512Mi.",
         "beacon pods have a memory limit of 1Gi.", 0.95, "supersede"),
        # Contradictions: negation or opposite words on one side only.
        ("The `new_checkout` feature flag is enabled for all users.",
         "The `new_checkout` feature flag is disabled for all users.", 0.93, "conflict"),
        ("Always rebase feature branches onto main before merging.",
         "Never rebase feature branches; merge main into them instead.", 0.80, "conflict"),
        # A loose paraphrase may word the same rule with a negation: a contradiction
        # restates what it negates, sharing more than a third of its words.
        ("`npm run typecheck` runs `tsc --noEmit` across the project.",
         "Type checking without emitting output is wired to the typecheck npm script "
         "(tsc --noEmit).", 0.81, "fold"),
        ("The public REST API is versioned under `/api/v2/`; v1 routes were removed.",
         "All public endpoints live beneath /api/v2, and the v1 prefix no longer exists.",
         0.77, "fold"),
        # Duplicates: reworded, same values (number words and units included).
        ("Kubernetes pods for beacon have a memory limit of 512Mi.",
         "beacon containers are capped at 512 MiB of RAM in the k8s manifests.", 0.81, "fold"),
        ("Terraform state is stored in the S3 bucket `acme-tfstate` with DynamoDB locking.",
         "Remote Terraform state lives in S3 bucket acme-tfstate with a DynamoDB lock.",
         0.85, "fold"),
        # Another attribute of the same subject is a new fact.
        ("The Celery worker concurrency is 8.", "The Celery worker prefetch multiplier is 1.",
         0.75, "insert"),
        ("The `/healthz` endpoint is the liveness probe.",
         "The `/readyz` endpoint is the readiness probe and checks the database.", 0.78, "insert"),
        # Different subjects sharing words.
        ("Cloudflare Workers serve redirects for the marketing site.",
         "Celery workers serve PDF exports for the reporting site.", 0.40, "insert"),
        # Same words, roles swapped: never folded.
        ("The project was cancelled one year before Boeing acquired McDonnell Douglas.",
         "The project was cancelled one year before McDonnell Douglas acquired Boeing.",
         0.99, "insert"),
    ],
)  # fmt: skip
def test_decision_follows_what_differs_between_the_texts(
    old: str, new: str, similarity: float, expected: str
) -> None:
    assert action(old, new, similarity) == expected


def test_a_reordered_near_copy_is_not_folded_because_roles_may_have_swapped() -> None:
    # Folding would make the new wording canonical; when the same words moved, the
    # meaning may have flipped, so both are kept (the consolidation sweep can merge later).
    assert (
        action(
            "Terraform state is stored in the S3 bucket acme-tfstate with DynamoDB locking.",
            "Remote state lives in the S3 bucket acme-tfstate, locked with DynamoDB.",
            0.85,
        )
        == "insert"
    )


def test_exact_normalized_repeat_always_folds() -> None:
    assert action("Use `uv` for installs.", "use uv for installs", None) == "fold"
    assert action("Use `uv` for installs.", "USE UV FOR INSTALLS!!", 0.1) == "fold"


def test_lexical_floor_folds_near_copies_and_keeps_value_changes_apart() -> None:
    assert (
        action(
            "Run the linter with make lint before pushing",
            "Run the linter with make lint before a push",
            None,
        )
        == "fold"
    )
    assert (
        action("The API listens on port 8080", "The API listens on port 9090", None) == "supersede"
    )
    assert action("Run tests with pytest -x", "Never run tests with -x", None) == "conflict"


def test_values_are_found_in_code_paths_versions_and_names() -> None:
    found = values("Use `pytest -n auto` with Python 3.12 from ~/.venvs/app on api.acme.io")
    assert {"pytest -n auto", "3.12", "~/.venvs/app", "api.acme.io"} <= found


def test_polarity_counts_negations_including_contractions() -> None:
    assert polarity("Don't retry calls; they are not idempotent") == 2
    assert polarity("Retry calls freely") == 0


def test_a_value_inside_a_longer_value_is_not_the_same_value() -> None:
    evidence = compare(
        "Migrations live in `db/migrations`.", "Migrations live in `src/db/migrations`."
    )
    assert "db/migrations" in evidence.old_only_values


@pytest.mark.parametrize(
    ("old", "new", "similarity", "expected"),
    [
        # "on" / "off" are stop words to search, but opposites here.
        (
            "Server-side rendering is on for the marketing pages.",
            "Server-side rendering is off for the marketing pages; they are static exports.",
            0.79,
            "conflict",
        ),
        (
            "GraphQL introspection is enabled in production.",
            "GraphQL introspection is turned off in production.",
            0.91,
            "conflict",
        ),
        (
            "Feature branches are deleted after merge.",
            "Feature branches are kept after merge for auditing.",
            0.83,
            "conflict",
        ),
        (
            "Avoid `unwrap()` in mantis library code.",
            "`unwrap()` is acceptable in mantis tests and examples.",
            0.85,
            "conflict",
        ),
        # The "not" of a contrast rejects the alternative: no contradiction...
        (
            "In hawk, use `slog` for logging, not `logrus`.",
            "hawk logs through slog rather than logrus.",
            0.86,
            "insert",
        ),
        # ...unless the other side states what it rejects.
        (
            "The API returns timestamps in UTC.",
            "The API returns timestamps in the server's local time, not UTC.",
            0.94,
            "conflict",
        ),
        # "every minute" is one minute: a changed interval, not a rewording.
        ("ArgoCD polls git every 3 minutes.", "ArgoCD polls git every minute.", 0.98, "supersede"),
        # Two people's turns of one conversation are two statements.
        (
            "Melanie: Wow, Caroline! That's awesome! Taking in kids in need - you're so kind.",
            "Caroline: Thanks, Melanie! That's really kind. Taking in kids is my dream.",
            0.86,
            "insert",
        ),
        # Little shared, much said on each side: two statements, however close.
        (
            "Caroline: Wow, Melanie! The colors really blend nicely. Painting looks like a "
            "great outlet for expressing yourself.",
            "Caroline: Thanks, Melanie! That's really sweet. Is this your own painting? "
            "I love the bright flowers and the sky behind them.",
            0.80,
            "insert",
        ),
    ],
)
def test_opposites_intervals_and_conversations_are_never_folded(
    old: str, new: str, similarity: float, expected: str
) -> None:
    assert action(old, new, similarity) == expected


def test_judging_from_the_words_first_decides_as_the_whole_evidence_does() -> None:
    """``judge`` answers "different subject" from the texts' words alone where it can;
    over every pair of the coding set, both ways, with and without a cosine, and with
    thresholds moved, it decides exactly as ``decide(compare(...))``."""
    import itertools
    import json
    from pathlib import Path

    from memory_mcp.fold import judge

    data = Path(__file__).parents[1] / "bench" / "fold-pairs-coding.jsonl"
    rows = [json.loads(line) for line in data.open()]
    texts = sorted({t for row in rows for t in (row["a"], row["b"])})[:80]
    pairs = [(r["a"], r["b"]) for r in rows] + list(itertools.combinations(texts, 2))
    shortcuts = 0
    for settings in (FoldSettings(), FoldSettings(lexical_subject=0.2, dense_subject=0.5)):
        for n, (a, b) in enumerate(pairs):
            for old, new in ((a, b), (b, a)):
                for similarity in (None, 0.3, 0.69, 0.7, 0.9):
                    similarity = None if similarity is None else similarity + (n % 7) / 100
                    whole = decide(compare(old, new, similarity), settings)
                    assert judge(old, new, similarity, settings) == whole, (old, new, similarity)
                    shortcuts += whole.reason == "different subject"
    assert shortcuts > 1000  # the shortcut is taken, and agrees


def test_the_bit_parallel_lcs_equals_the_dynamic_programme() -> None:
    """``lcs_length`` against the textbook table, on random word sequences of a small
    vocabulary (many repeats), lengths 0 to 70 (past 64 bits)."""
    import random

    from memory_mcp.fold import lcs_length

    def table(a: list[str], b: list[str]) -> int:
        previous = [0] * (len(b) + 1)
        for word in a:
            row = [0]
            for j, other in enumerate(b):
                row.append(previous[j] + 1 if word == other else max(previous[j + 1], row[j]))
            previous = row
        return previous[-1]

    rng = random.Random(7)
    for _ in range(400):
        vocabulary = [f"w{i}" for i in range(rng.randint(1, 12))]
        a = [rng.choice(vocabulary) for _ in range(rng.randint(0, 70))]
        b = [rng.choice(vocabulary) for _ in range(rng.randint(0, 70))]
        assert lcs_length(a, b) == table(a, b), (a, b)


def test_value_tokens_are_those_of_every_kind_at_once() -> None:
    """The value kinds a text cannot hold are left out of the expression it is read with:
    the tokens are the same as with every kind (the bench's coding pairs, generated
    memories, and texts with each kind's character alone or in odd places)."""
    import json
    import re
    from pathlib import Path

    from memory_mcp.bench.perf import generate
    from memory_mcp.fold import VALUE_KINDS, _value_tokens

    every = re.compile("|".join(pattern for pattern, _ in VALUE_KINDS))
    data = Path(__file__).parents[1] / "bench" / "fold-pairs-coding.jsonl"
    texts = [t for line in data.open() for t in (json.loads(line)["a"], json.loads(line)["b"])]
    texts += [text for _, text, _ in generate(400, seed=3)]
    texts += [
        "Run `make test` with --verbose=2 on https://ci.example.com/job/7 as @ops/bot",
        "snake_case and camelCase and PascalCase in src/app.py, not ALLCAPS",
        "Timeout is ٣٠ seconds (Arabic-Indic digits), ５ retries (full-width)",  # noqa: RUF001
        "a-b c.d e/f g_h @ ` : // x:// Éclair Île ÀB 1.2.3",
        "",
        "plain words only, nothing else",
    ]
    for text in texts:
        found = [(m.start(), m.group(0)) for m in _value_tokens(text)]
        assert found == [(m.start(), m.group(0)) for m in every.finditer(text)], text


@pytest.mark.parametrize(
    "text",
    [
        "Use pnpm, NOT npm, But Not yarn; RATHER THAN bun, Instead Of deno",
        "MOVED from A to B, RENAMED, Took Over, No Longer, since Monday",
        "Once A Day, EVERY MINUTE, per hour",
    ],
)
@pytest.mark.parametrize("name", ["_CONTRAST", "_REJECTED", "_CHANGE_CUE", "_ONE_UNIT"])
def test_the_folds_caseless_cues_match_what_ignorecase_matches(name: str, text: str) -> None:
    pattern: Caseless = getattr(fold, name)
    literal = re.sub(r"\\.", "", pattern.folded.pattern)  # escapes (\S, \b) aside
    assert literal == literal.lower()  # written in lower case
    found = pattern.findall(text)
    assert found == [m.lower() for m in pattern.unicode.findall(text)]
    assert pattern.search(text) == bool(found)


def test_cues_are_found_whatever_their_case() -> None:
    assert compare("The API listens on 8080", "The API MOVED to 9090", 0.9).change_cue
    assert compare("Timestamps are in UTC", "Timestamps are in local time, NOT UTC", 0.9).antonym
    assert "1" in values("The report is built EVERY DAY")
    # the contrast's "not" rejects npm, it does not negate the statement
    assert not compare("Use pnpm", "Use pnpm, NOT npm", 0.9).polarity_flip
