"""``memory-mcp bench fold``: what the write pipeline does with labelled pairs.

Each pair ``{"a", "b", "label"}`` gets a fresh project scope: ``a`` is stored,
then ``b``, through the same ``MemoryService.store_many`` the tools use, and
the action taken on ``b`` is counted per label (bench/FORMAT.md).
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memory_mcp.bench.files import read_jsonl
from memory_mcp.config import FoldSettings, replaced
from memory_mcp.errors import InvalidInput
from memory_mcp.fold import Evidence, compare, decide
from memory_mcp.passages import record_passages
from memory_mcp.service import MemoryService, StoreRequest

ACTIONS = ("folded", "superseded", "conflict", "inserted")
LABELS = ("duplicate", "update", "contradiction", "related", "unrelated", "distinct")


@dataclass(frozen=True)
class FoldPair:
    a: str
    b: str
    label: str
    source: str = ""


@dataclass
class FoldReport:
    """Actions per label (and per source), with fold precision and recall."""

    counts: dict[str, Counter[str]] = field(default_factory=dict)
    by_source: dict[str, dict[str, Counter[str]]] = field(default_factory=dict)
    embedder: str = "bm25"

    @property
    def pairs(self) -> int:
        return sum(sum(c.values()) for c in self.counts.values())

    @property
    def folds(self) -> int:
        return sum(c["folded"] for c in self.counts.values())

    @property
    def fold_precision(self) -> float | None:
        if not self.folds:
            return None
        return self.counts.get("duplicate", Counter())["folded"] / self.folds

    @property
    def fold_recall(self) -> float | None:
        duplicates = sum(self.counts.get("duplicate", Counter()).values())
        if not duplicates:
            return None
        return self.counts["duplicate"]["folded"] / duplicates

    def add(self, pair: FoldPair, action: str) -> None:
        """Count what was done with one pair's ``b``, under its label and its source."""
        self.counts.setdefault(pair.label, Counter())[action] += 1
        labels = self.by_source.setdefault(source_family(pair.source), {})
        labels.setdefault(pair.label, Counter())[action] += 1

    def old_value_kept(self, label: str) -> tuple[int, int]:
        """For updates and contradictions: (old value kept visible, two current facts).

        Superseded (old in history), conflict (both flagged) and folded (old text
        in ``merged_from``) keep the old value visible; an insert leaves two
        unrelated current facts.
        """
        c = self.counts.get(label, Counter())
        return c["superseded"] + c["conflict"] + c["folded"], c["inserted"]

    def to_json(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "embedder": self.embedder,
            "fold_precision": self.fold_precision,
            "fold_recall": self.fold_recall,
            "counts": {label: dict(c) for label, c in self.counts.items()},
            "by_source": {
                source: {label: dict(c) for label, c in labels.items()}
                for source, labels in self.by_source.items()
            },
        }


_ROW = re.compile(r"\s*\brow\s*\d+\s*$", re.IGNORECASE)


def source_family(source: str) -> str:
    """A pair's source without its row number ("PAWS-Wiki ... test row 12" -> "... test")."""
    return _ROW.sub("", source) or "-"


def read_pairs(path: Path) -> list[FoldPair]:
    """Read labelled pairs (JSONL).

    Raises:
        InvalidInput: a line is not a pair (the message names it).
    """
    pairs = list(read_jsonl(path, _pair, "a fold pair"))
    if not pairs:
        raise InvalidInput(f"{path} holds no pairs")
    return pairs


def _pair(data: Any) -> FoldPair:
    return FoldPair(str(data["a"]), str(data["b"]), str(data["label"]), str(data.get("source", "")))


async def run_fold_bench(
    memory: MemoryService,
    pairs: list[FoldPair],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> FoldReport:
    """Store each pair in its own scope and count what happened to ``b``.

    ``memory`` should be opened on a scratch database: the bench writes to it.
    """
    report = FoldReport(embedder=memory.engine.embeddings.identity or "bm25")
    with tempfile.TemporaryDirectory(prefix="memory-mcp-bench-fold-") as tmp:
        chunk = 100
        for start in range(0, len(pairs), chunk):
            requests: list[StoreRequest] = []
            for offset, pair in enumerate(pairs[start : start + chunk]):
                scope_dir = Path(tmp) / f"pair-{start + offset:05d}"
                (scope_dir / ".git").mkdir(parents=True)
                requests.append(StoreRequest(pair.a, cwd=scope_dir, agent="bench"))
                requests.append(StoreRequest(pair.b, cwd=scope_dir, agent="bench"))
            results = await memory.store_many(requests)
            for offset, pair in enumerate(pairs[start : start + chunk]):
                report.add(pair, results[2 * offset + 1].action)
            if progress is not None:
                progress(start + len(requests) // 2, len(pairs))
    return report


# Cross-validation of the decision's thresholds ---------------------------------------

# The fold threshold candidates (fold.dense_threshold) a training split chooses from.
THRESHOLDS = tuple(round(0.70 + 0.01 * i, 2) for i in range(26))
PRECISION_GOAL = 0.95


@dataclass
class CrossValidation:
    """Out-of-fold decisions: each pair decided with the threshold its training folds chose."""

    report: FoldReport
    chosen: list[float]  # the threshold each fold's training pairs chose

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(), "thresholds_chosen": self.chosen}


async def pair_evidence(memory: MemoryService, pairs: list[FoldPair]) -> list[Evidence]:
    """What the write pipeline's decision sees for each pair, alone in its scope.

    ``compare(a, b, cosine)``, the cosine being ``b``'s vector against the best of
    ``a``'s passages, as ``write.neighbours`` reads it; none on the lexical floor.
    """
    import numpy as np

    passages = {p.a: record_passages(p.a, []) for p in pairs}
    texts = sorted({t for ps in passages.values() for t in ps} | {p.b for p in pairs})
    vectors: dict[str, Any] = {}
    for start in range(0, len(texts), 256):
        batch = texts[start : start + 256]
        embedded = await memory.engine.embeddings.embed(batch)
        if embedded is None:
            return [compare(p.a, p.b) for p in pairs]
        vectors.update(zip(batch, np.asarray(embedded), strict=True))
    return [
        compare(p.a, p.b, max(float(vectors[t] @ vectors[p.b]) for t in passages[p.a]))
        for p in pairs
    ]


def _counts(
    pairs: list[FoldPair], evidence: list[Evidence], threshold: float, settings: FoldSettings
) -> tuple[int, int, int]:
    """(folds, true duplicates among them, contradictions among them) at ``threshold``."""
    chosen = replaced(settings, dense_threshold=threshold)
    folds = dup = contra = 0
    for pair, ev in zip(pairs, evidence, strict=True):
        if decide(ev, chosen).action == "fold":
            folds += 1
            dup += pair.label == "duplicate"
            contra += pair.label == "contradiction"
    return folds, dup, contra


def choose_threshold(
    pairs: list[FoldPair], evidence: list[Evidence], settings: FoldSettings
) -> float:
    """The threshold that folds the most duplicates at fold precision >= PRECISION_GOAL
    with no contradiction folded, on these pairs; the highest one when none does."""
    best = (THRESHOLDS[-1], -1)
    for threshold in THRESHOLDS:
        folds, dup, contra = _counts(pairs, evidence, threshold, settings)
        if contra == 0 and folds and dup / folds >= PRECISION_GOAL and dup > best[1]:
            best = (threshold, dup)
    return best[0]


def cross_validate(
    pairs: list[FoldPair],
    evidence: list[Evidence],
    settings: FoldSettings,
    *,
    k: int,
    embedder: str,
) -> CrossValidation:
    """k-fold cross-validation of ``fold.dense_threshold``, stratified by source and label.

    For each fold, the threshold is chosen on the other folds' pairs
    (``choose_threshold``) and the fold's pairs are decided with it: the
    figures are what the choice does on pairs it did not see.
    """
    strata: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, pair in enumerate(pairs):
        strata[(source_family(pair.source), pair.label)].append(i)
    fold_of = [0] * len(pairs)
    for members in strata.values():
        for position, index in enumerate(members):
            fold_of[index] = position % k
    report = FoldReport(embedder=embedder)
    chosen: list[float] = []
    done = {"fold": "folded", "supersede": "superseded", "conflict": "conflict"}
    for held_out in range(k):
        train = [i for i in range(len(pairs)) if fold_of[i] != held_out]
        threshold = choose_threshold(
            [pairs[i] for i in train], [evidence[i] for i in train], settings
        )
        chosen.append(threshold)
        decided = replaced(settings, dense_threshold=threshold)
        for i in range(len(pairs)):
            if fold_of[i] != held_out:
                continue
            report.add(pairs[i], done.get(decide(evidence[i], decided).action, "inserted"))
    return CrossValidation(report, chosen)
