"""Settings: one typed object, loaded in layers.

Layers, later wins: defaults < user config file < project config file <
``MEMORY_MCP_*`` environment variables. Every setting has a default and a help
string; ``config.example.toml`` documents each one (a test keeps them in step).

Environment variables are named ``MEMORY_MCP_<SECTION>_<KEY>`` (``MEMORY_MCP_<KEY>``
for top-level keys), e.g. ``MEMORY_MCP_DATA_DIR`` or
``MEMORY_MCP_EMBEDDER_MODEL_PATH``.

A project config file (``.memory-mcp.toml`` at the project root) comes with the
repository, so it may only tune behaviour (write policy, folding, search,
ranking); where memories are stored and which endpoints see them stay in the
user's hands.
"""

from __future__ import annotations

import os
import shlex
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from memory_mcp.errors import ConfigError

ENV_PREFIX = "MEMORY_MCP_"
USER_CONFIG_ENV = "MEMORY_MCP_CONFIG"
PROJECT_CONFIG_NAME = ".memory-mcp.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EmbedderSettings(_Section):
    backend: Literal["auto", "fastembed", "openai", "bm25"] = Field(
        "auto",
        description=(
            "Which embedder makes vectors. auto: the best one present (an OpenAI-compatible "
            "endpoint if configured, else fastembed), never downgrading a store that already "
            "holds dense vectors; bm25: lexical only, no vectors."
        ),
    )
    model: str = Field(
        "sentence-transformers/all-MiniLM-L6-v2", description="fastembed model name."
    )
    model_path: str = Field(
        "",
        description=(
            "Local folder holding the model's ONNX export (model.onnx, tokenizer.json, ...). "
            "Empty: fastembed's cache, else a background download."
        ),
    )
    cache_dir: str = Field("", description="fastembed's model cache. Empty: fastembed's default.")
    download: bool = Field(
        True, description="Let fastembed download the model when it is not cached."
    )
    threads: int = Field(
        0, ge=0, description="Threads for ONNX inference. 0: onnxruntime's default."
    )
    max_tokens: int = Field(
        256,
        ge=16,
        le=8192,
        description="Tokens per embedded window (all-MiniLM-L6-v2 was trained on 256).",
    )
    batch_size: int = Field(
        4,
        ge=1,
        le=1024,
        description=(
            "Texts per embedding batch (one model run, or one HTTP request). On a CPU, "
            "larger batches are no faster and need far more memory for long texts; an HTTP "
            "embeddings server may prefer 32 or more."
        ),
    )
    openai_base_url: str = Field(
        "",
        description=(
            "Base URL of an OpenAI-compatible embeddings API, e.g. http://127.0.0.1:11434/v1 "
            "(ollama). Empty: not used."
        ),
    )
    openai_model: str = Field("", description="Model name sent to the embeddings API.")
    openai_api_key: str = Field(
        "", description="Bearer key for the embeddings API (prefer the environment variable)."
    )
    openai_timeout: float = Field(
        10.0, gt=0, description="Seconds before an embeddings API request fails."
    )


class WriteSettings(_Section):
    secrets: Literal["redact", "reject", "off"] = Field(
        "redact",
        description=(
            "What to do with secrets (API keys, tokens, private keys, passwords) in stored "
            "content: redact them, reject the write, or store as is. Unless off, searches "
            "and the brief also redact what they show, and maintenance re-scans stored "
            "text when the rules change."
        ),
    )
    max_chars: int = Field(
        64_000,
        ge=100,
        le=1_000_000,
        description="Longest content accepted, in characters (longer writes are refused).",
    )


class FoldSettings(_Section):
    dense_threshold: float = Field(
        0.75,
        ge=0,
        le=1,
        description=(
            "Cosine similarity from which a dense-embedded pair may fold when nothing "
            "differs between them (values, negation, order)."
        ),
    )
    dense_subject: float = Field(
        0.70,
        ge=0,
        le=1,
        description=(
            "Cosine similarity from which two dense-embedded facts are about the same "
            "subject (candidates for supersede or conflict)."
        ),
    )
    lexical_threshold: float = Field(
        0.60,
        ge=0,
        le=1,
        description="Word-overlap similarity from which a pair may fold without vectors.",
    )
    lexical_subject: float = Field(
        0.45,
        ge=0,
        le=1,
        description="Word-overlap similarity from which two facts are about the same subject.",
    )
    candidates: int = Field(
        6, ge=1, le=50, description="Nearest records the new one is compared with."
    )


class SearchSettings(_Section):
    min_relevance: float = Field(
        0.1,
        ge=0,
        le=1,
        description=(
            "Hits less relevant than this (fused relevance, 0 to 1) are not returned, so an "
            "unrelated memory is never padding."
        ),
    )
    candidates: int = Field(
        60, ge=10, le=1000, description="Hits each branch (lexical, dense) contributes to fusion."
    )
    lexical_weight: float = Field(
        0.2,
        ge=0,
        le=1,
        description=(
            "Weight of the lexical (BM25) branch in fused relevance; the dense branch has the "
            "rest. Each branch alone counts fully when the other is unavailable."
        ),
    )


class RankingSettings(_Section):
    half_life_days: float = Field(
        30.0,
        gt=0,
        description="Days after which recency counts half (pinned records never decay).",
    )
    durable_half_life_days: float = Field(
        180.0,
        gt=0,
        description=(
            "Half-life of decisions, preferences, procedures, gotchas, goals and plans, which "
            "are meant to last."
        ),
    )
    prior_weight: float = Field(
        0.15,
        ge=0,
        le=1,
        description=(
            "Share of the final score given to the prior (importance x recency x "
            "reinforcement) when there is a query; relevance has the rest."
        ),
    )


class StorageSettings(_Section):
    driver: Literal["auto", "sqlite3", "sqlean", "pysqlite3"] = Field(
        "auto",
        description=(
            "SQLite module: auto takes the first that can load sqlite-vec (Python's sqlite3, "
            "then sqlean.py, then pysqlite3)."
        ),
    )
    busy_timeout_ms: int = Field(
        15000,
        ge=100,
        description="How long a write waits for another process's write before failing.",
    )


class BriefSettings(_Section):
    budget_tokens: int = Field(
        1200,
        ge=100,
        le=20000,
        description="Token budget of the spawn brief (estimated as characters / 4).",
    )
    journal_entries: int = Field(
        5, ge=0, le=50, description="Most recent journal entries the brief shows, at most."
    )
    line_chars: int = Field(
        200, ge=60, le=2000, description="Characters of one memory in the brief before it is cut."
    )


class ServeSettings(_Section):
    host: str = Field(
        "127.0.0.1",
        description="Address the HTTP transports bind. Anything but loopback needs a token.",
    )
    port: int = Field(8765, ge=1, le=65535, description="Port of the HTTP transports.")
    token: str = Field(
        "",
        description=(
            "Bearer token every HTTP request must carry (Authorization: Bearer ...). Required "
            "to bind a non-loopback host; prefer the environment variable MEMORY_MCP_SERVE_TOKEN."
        ),
    )
    allowed_hosts: str = Field(
        "",
        description=(
            "Comma-separated extra Host header values the HTTP transports accept (DNS-rebinding "
            "protection), e.g. memory.internal:8765. Loopback names, the bound address and this "
            "machine's name are always accepted."
        ),
    )


class MaintenanceSettings(_Section):
    enabled: bool = Field(
        True,
        description=(
            "Run the maintenance loop inside `memory-mcp serve` (re-embed, consolidate, "
            "insights, staleness, purge). `memory-mcp maintain` runs it on demand either way."
        ),
    )
    interval_minutes: float = Field(
        60.0,
        ge=1,
        description=(
            "Minutes between two runs of the consolidation sweep, insights, staleness and "
            "purge. Re-embedding runs whenever records await vectors."
        ),
    )
    check_seconds: float = Field(
        60.0, ge=1, description="How often the server's loop looks for a task that is due."
    )
    sweep_facts: int = Field(
        1000,
        ge=1,
        description=(
            "Most facts one consolidation run of the server's loop compares; the rest waits "
            "for the next check, so a first sweep of a large store comes in slices."
        ),
    )
    lease_seconds: int = Field(
        600,
        ge=30,
        description=(
            "How long a task's lease lasts before another process may take it over; a running "
            "task renews it between batches."
        ),
    )
    retry_minutes: float = Field(
        5.0,
        gt=0,
        description="First wait after a task fails (an embedder outage); it doubles each time.",
    )
    retry_max_minutes: float = Field(
        360.0, gt=0, description="Longest wait between two attempts of a failing task."
    )
    consolidate: bool = Field(
        True,
        description=(
            "Fold the duplicates the write-time fold missed, across each whole project, with "
            "the same rules ([fold]); contradictions become conflicts."
        ),
    )
    insights: bool = Field(
        True, description="Write insights: summaries of groups of related facts."
    )
    insight_similarity: float = Field(
        0.6,
        ge=0,
        le=1,
        description="Cosine similarity from which two facts belong to one insight's group.",
    )
    insight_min_facts: int = Field(3, ge=2, description="Fewest facts an insight summarizes.")
    insight_max_facts: int = Field(12, ge=2, description="Most facts one insight summarizes.")
    dormant_days: int = Field(
        90,
        description=(
            "A project with no write or search for this many days is dormant: its facts never "
            "returned by a search are archived (reason dormant). Negative: never."
        ),
    )
    stale_days: int = Field(
        30, ge=0, description="Only facts older than this many days are archived as dormant."
    )
    grace_days: float = Field(
        30.0,
        ge=0,
        description=(
            "Archived records are purged (deleted for good) this many days after they were "
            "archived; until then `memory-mcp restore` brings them back."
        ),
    )
    llm_base_url: str = Field(
        "",
        description=(
            "OpenAI-compatible chat endpoint that refines the text of consolidated memories "
            "and writes insights, e.g. http://127.0.0.1:11434/v1. Empty: not used."
        ),
    )
    llm_model: str = Field("", description="Model name sent to the chat endpoint.")
    llm_api_key: str = Field(
        "", description="Bearer key for the chat endpoint (prefer the environment variable)."
    )
    llm_command: str = Field(
        "",
        description=(
            "Command that refines instead of an endpoint, e.g. `claude -p {prompt}` or "
            "`codex exec {prompt}`: {prompt} becomes one argument (no shell); without it the "
            "prompt goes to standard input. The answer is its standard output. Empty: not used."
        ),
    )
    llm_timeout: float = Field(
        120.0, gt=0, description="Seconds before an LLM call is abandoned (the text stays as is)."
    )

    @field_validator("llm_command")
    @classmethod
    def _splits(cls, value: str) -> str:
        if value.strip():
            try:
                if not shlex.split(value):
                    raise ValueError("it names no command")
            except ValueError as exc:
                raise ValueError(f"{value!r} does not parse as a command: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _ranges(self) -> MaintenanceSettings:
        if self.insight_min_facts > self.insight_max_facts:
            raise ValueError("insight_min_facts is larger than insight_max_facts")
        if self.retry_minutes > self.retry_max_minutes:
            raise ValueError("retry_minutes is larger than retry_max_minutes")
        return self


class Settings(_Section):
    data_dir: str = Field(
        "",
        description=(
            "Directory of the memory database (memory.db). Empty: the user data directory "
            "(~/.local/share/memory-mcp on Linux)."
        ),
    )
    embedder: EmbedderSettings = Field(default_factory=EmbedderSettings)  # type: ignore[arg-type]
    write: WriteSettings = Field(default_factory=WriteSettings)  # type: ignore[arg-type]
    fold: FoldSettings = Field(default_factory=FoldSettings)  # type: ignore[arg-type]
    search: SearchSettings = Field(default_factory=SearchSettings)  # type: ignore[arg-type]
    ranking: RankingSettings = Field(default_factory=RankingSettings)  # type: ignore[arg-type]
    storage: StorageSettings = Field(default_factory=StorageSettings)  # type: ignore[arg-type]
    brief: BriefSettings = Field(default_factory=BriefSettings)  # type: ignore[arg-type]
    serve: ServeSettings = Field(default_factory=ServeSettings)  # type: ignore[arg-type]
    maintenance: MaintenanceSettings = Field(default_factory=MaintenanceSettings)  # type: ignore[arg-type]

    def database_path(self) -> Path:
        """Where the SQLite database lives."""
        base = Path(self.data_dir).expanduser() if self.data_dir else default_data_dir()
        return base / "memory.db"


# Sections a project's own config file may set (it travels with the repository).
PROJECT_SECTIONS = frozenset({"write", "fold", "search", "ranking", "brief"})


@dataclass(frozen=True)
class SettingInfo:
    """One setting, as documented."""

    section: str  # "" for top-level keys
    key: str
    default: Any
    description: str

    @property
    def env_var(self) -> str:
        parts = [self.section, self.key] if self.section else [self.key]
        return ENV_PREFIX + "_".join(parts).upper()

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}" if self.section else self.key


def iter_settings() -> Iterator[SettingInfo]:
    """Every setting with its section, default and help string."""
    for name, info in Settings.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, _Section):
            for key, sub in annotation.model_fields.items():
                yield SettingInfo(name, key, sub.default, sub.description or "")
        else:
            yield SettingInfo("", name, info.default, info.description or "")


@dataclass
class LoadedSettings:
    """Settings plus where they came from (shown by ``status``)."""

    settings: Settings
    sources: list[str] = field(default_factory=list)


def default_data_dir() -> Path:
    """The platform's per-user data directory for memory-mcp."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "memory-mcp"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "memory-mcp"
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "memory-mcp"


def user_config_path(env: Mapping[str, str]) -> Path:
    """The user config file: ``$MEMORY_MCP_CONFIG``, else the platform config dir."""
    explicit = env.get(USER_CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    if sys.platform == "win32":
        base = env.get("APPDATA") or str(Path.home() / "AppData" / "Roaming")
        return Path(base) / "memory-mcp" / "config.toml"
    xdg = env.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "memory-mcp" / "config.toml"


def load_settings(
    *, project_root: Path | None = None, env: Mapping[str, str] | None = None
) -> LoadedSettings:
    """Load the layered settings.

    Args:
        project_root: the project whose ``.memory-mcp.toml`` applies, if any.
        env: the environment to read (defaults to ``os.environ``).

    Raises:
        ConfigError: a file or variable is malformed or names an unknown setting.
    """
    env = os.environ if env is None else env
    merged: dict[str, Any] = {}
    sources = ["defaults"]

    user_file = user_config_path(env)
    if user_file.is_file():
        _merge(merged, _read_toml(user_file))
        sources.append(str(user_file))
    elif env.get(USER_CONFIG_ENV):
        raise ConfigError(f"{USER_CONFIG_ENV} names {user_file}, which is not a file")

    if project_root is not None:
        project_file = project_root / PROJECT_CONFIG_NAME
        if project_file.is_file():
            data = _read_toml(project_file)
            refused = sorted(k for k in data if k not in PROJECT_SECTIONS)
            if refused:
                raise ConfigError(
                    f"{project_file} sets {', '.join(refused)}; a project config file may only "
                    f"set the sections {', '.join(sorted(PROJECT_SECTIONS))}. Put the rest in "
                    f"the user config file ({user_file})."
                )
            _merge(merged, data)
            sources.append(str(project_file))

    env_layer = _env_layer(env)
    if env_layer:
        _merge(merged, env_layer)
        sources.append("environment")

    try:
        return LoadedSettings(Settings.model_validate(merged), sources)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    by_var = {info.env_var: info for info in iter_settings()}
    layer: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name == USER_CONFIG_ENV:
            continue
        info = by_var.get(name)
        if info is None:
            raise ConfigError(
                f"unknown environment variable {name}; see config.example.toml for the settings"
            )
        if info.section:
            layer.setdefault(info.section, {})[info.key] = value
        else:
            layer[info.key] = value
    return layer


def _merge(into: dict[str, Any], layer: Mapping[str, Any]) -> None:
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, Mapping):
            into[key] = dict(value)
        else:
            into[key] = value


def describe_errors(exc: ValidationError) -> str:
    """A validation error as ``where: what`` phrases joined by semicolons."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        problems.append(f"{where}: {err['msg']}")
    return "; ".join(problems)


def _describe(exc: ValidationError, sources: list[str]) -> str:
    return "invalid settings (" + ", ".join(sources) + "): " + describe_errors(exc)
