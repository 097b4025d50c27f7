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
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

import msgspec
from msgspec import Meta

from memory_mcp import dirs
from memory_mcp.errors import ConfigError

ENV_PREFIX = "MEMORY_MCP_"
USER_CONFIG_ENV = "MEMORY_MCP_CONFIG"
PROJECT_CONFIG_NAME = ".memory-mcp.toml"


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A settings table: typed keys with defaults and help strings, unknown keys refused."""


class EmbedderSettings(_Section):
    backend: Annotated[
        Literal["auto", "fastembed", "openai", "bm25"],
        Meta(
            description=(
                "Which embedder makes vectors. auto: the best one present (an OpenAI-compatible "
                "endpoint if configured, else fastembed), never downgrading a store that already "
                "holds dense vectors; bm25: lexical only, no vectors."
            )
        ),
    ] = "auto"
    model: Annotated[str, Meta(description="fastembed model name.")] = (
        "sentence-transformers/all-MiniLM-L6-v2"
    )
    model_path: Annotated[
        str,
        Meta(
            description=(
                "Local folder holding the model's ONNX export (model.onnx, tokenizer.json, ...). "
                "Empty: fastembed's cache, else a background download."
            )
        ),
    ] = ""
    cache_dir: Annotated[
        str, Meta(description="fastembed's model cache. Empty: fastembed's default.")
    ] = ""
    download: Annotated[
        bool, Meta(description="Let fastembed download the model when it is not cached.")
    ] = True
    threads: Annotated[
        int, Meta(ge=0, description="Threads for ONNX inference. 0: onnxruntime's default.")
    ] = 0
    quantize: Annotated[
        bool,
        Meta(
            description=(
                "Run all-MiniLM-L6-v2 with 8-bit weights in its matrix products (a copy made "
                "once in the cache folder), one text per run (batch_size does not apply): a "
                "text embeds in about half the time, bulk at about twice the rate, and its "
                "vectors differ a little from the model's (cosine 0.98 or more). They carry "
                "their own name, so a store that holds the other kind switches only with "
                "embedder.backend = 'fastembed', which re-embeds it."
            )
        ),
    ] = False
    load_wait_seconds: Annotated[
        float,
        Meta(
            ge=0,
            le=600,
            description=(
                "How long a search or a store waits for the embedding model while it loads "
                "from disk (about a second) before answering from the lexical floor. A model "
                "that must first be downloaded is not waited for."
            ),
        ),
    ] = 15.0
    max_tokens: Annotated[
        int,
        Meta(
            ge=16,
            le=8192,
            description="Tokens per embedded window (all-MiniLM-L6-v2 was trained on 256).",
        ),
    ] = 256
    batch_size: Annotated[
        int,
        Meta(
            ge=1,
            le=1024,
            description=(
                "Texts per embedding batch (one model run, or one HTTP request). On a CPU, "
                "larger batches are no faster and need far more memory for long texts; an HTTP "
                "embeddings server may prefer 32 or more."
            ),
        ),
    ] = 4
    openai_base_url: Annotated[
        str,
        Meta(
            description=(
                "Base URL of an OpenAI-compatible embeddings API, e.g. http://127.0.0.1:11434/v1 "
                "(ollama). Empty: not used."
            )
        ),
    ] = ""
    openai_model: Annotated[str, Meta(description="Model name sent to the embeddings API.")] = ""
    openai_api_key: Annotated[
        str,
        Meta(description="Bearer key for the embeddings API (prefer the environment variable)."),
    ] = ""
    openai_timeout: Annotated[
        float, Meta(gt=0, description="Seconds before an embeddings API request fails.")
    ] = 10.0


class WriteSettings(_Section):
    secrets: Annotated[
        Literal["redact", "reject", "off"],
        Meta(
            description=(
                "What to do with secrets (API keys, tokens, private keys, passwords) in stored "
                "content: redact them, reject the write, or store as is. Unless off, searches "
                "and the brief also redact what they show, and maintenance re-scans stored "
                "text when the rules change."
            )
        ),
    ] = "redact"
    max_chars: Annotated[
        int,
        Meta(
            ge=100,
            le=1_000_000,
            description="Longest content accepted, in characters (longer writes are refused).",
        ),
    ] = 64_000


class FoldSettings(_Section):
    dense_threshold: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description=(
                "Cosine similarity from which a dense-embedded pair may fold when nothing "
                "differs between them (values, negation, order)."
            ),
        ),
    ] = 0.75
    dense_subject: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description=(
                "Cosine similarity from which two dense-embedded facts are about the same "
                "subject (candidates for supersede or conflict)."
            ),
        ),
    ] = 0.70
    lexical_threshold: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description="Word-overlap similarity from which a pair may fold without vectors.",
        ),
    ] = 0.60
    lexical_subject: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description="Word-overlap similarity from which two facts are about the same subject.",
        ),
    ] = 0.45
    candidates: Annotated[
        int, Meta(ge=1, le=50, description="Nearest records the new one is compared with.")
    ] = 6


class SearchSettings(_Section):
    min_relevance: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description=(
                "Hits less relevant than this (fused relevance, 0 to 1) are not returned, so an "
                "unrelated memory is never padding. 0.3 suits all-MiniLM-L6-v2 (unrelated "
                "texts score 0.1 to 0.3); another model may want its own."
            ),
        ),
    ] = 0.3
    candidates: Annotated[
        int,
        Meta(
            ge=10, le=1000, description="Hits each branch (lexical, dense) contributes to fusion."
        ),
    ] = 60
    lexical_weight: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description=(
                "Weight of the lexical (BM25) branch in fused relevance; the dense branch has the "
                "rest. Each branch alone counts fully when the other is unavailable."
            ),
        ),
    ] = 0.2
    context_minutes: Annotated[
        float,
        Meta(
            ge=0,
            le=1440,
            description=(
                "Memories of one project and corpus written within this many minutes of each "
                "other are read as one conversation: a memory also ranks by the words "
                "of the one before or after it (a reply by the question it answers), once "
                "it is relevant enough on its own. 0 turns it off."
            ),
        ),
    ] = 30.0
    feedback_weight: Annotated[
        float,
        Meta(
            ge=0,
            le=5,
            description=(
                "Pseudo-relevance feedback: how far the query vector moves toward the mean of "
                "its five best candidates before they are ranked again (what the best hits "
                "share lifts the others about it). It re-orders, never admits: min_relevance "
                "is checked without it. 0 turns it off."
            ),
        ),
    ] = 0.7


class RankingSettings(_Section):
    half_life_days: Annotated[
        float,
        Meta(
            gt=0, description="Days after which recency counts half (pinned records never decay)."
        ),
    ] = 30.0
    durable_half_life_days: Annotated[
        float,
        Meta(
            gt=0,
            description=(
                "Half-life of decisions, preferences, procedures, gotchas, goals and plans, which "
                "are meant to last."
            ),
        ),
    ] = 180.0
    prior_weight: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description=(
                "Share of the final score given to the prior (importance x recency x "
                "reinforcement) when there is a query; relevance has the rest."
            ),
        ),
    ] = 0.15


class StorageSettings(_Section):
    url: Annotated[
        str,
        Meta(
            description=(
                "Where the memories are stored: empty for the SQLite file in data_dir, "
                "sqlite:///path/to/memory.db for another SQLite file, "
                "postgresql://user@host/dbname for a team's PostgreSQL with pgvector "
                "(pip install 'memory-mcp[postgres]'; the password from PGPASSWORD or "
                "~/.pgpass rather than the URL)."
            )
        ),
    ] = ""
    driver: Annotated[
        Literal["auto", "sqlite3", "sqlean", "pysqlite3"],
        Meta(
            description=(
                "SQLite module: auto takes the first that can load sqlite-vec (Python's sqlite3, "
                "then sqlean.py, then pysqlite3)."
            )
        ),
    ] = "auto"
    busy_timeout_ms: Annotated[
        int,
        Meta(
            ge=100, description="How long a write waits for another process's write before failing."
        ),
    ] = 15000


class BriefSettings(_Section):
    budget_tokens: Annotated[
        int,
        Meta(
            ge=100,
            le=20000,
            description="Token budget of the spawn brief (estimated as characters / 4).",
        ),
    ] = 1200
    journal_entries: Annotated[
        int, Meta(ge=0, le=50, description="Most recent journal entries the brief shows, at most.")
    ] = 5
    line_chars: Annotated[
        int,
        Meta(ge=60, le=2000, description="Characters of one memory in the brief before it is cut."),
    ] = 200


class ServeSettings(_Section):
    host: Annotated[
        str,
        Meta(description="Address the HTTP transports bind. Anything but loopback needs a token."),
    ] = "127.0.0.1"
    port: Annotated[int, Meta(ge=1, le=65535, description="Port of the HTTP transports.")] = 8765
    token: Annotated[
        str,
        Meta(
            description=(
                "Bearer token every HTTP request must carry (Authorization: Bearer ...). "
                "Required to bind a non-loopback host; prefer the environment variable "
                "MEMORY_MCP_SERVE_TOKEN."
            )
        ),
    ] = ""
    tokens_file: Annotated[
        str,
        Meta(
            description=(
                "A file of users and the SHA-256 of their bearer tokens (team mode): a request "
                "carrying one of them comes from that user. `memory-mcp team token NAME` adds "
                "one; the file is read again when it changes."
            )
        ),
    ] = ""
    allowed_hosts: Annotated[
        str,
        Meta(
            description=(
                "Comma-separated extra Host header values the HTTP transports accept "
                "(DNS-rebinding protection), e.g. memory.internal:8765. Loopback names, the "
                "bound address and this machine's name are always accepted."
            )
        ),
    ] = ""


class MaintenanceSettings(_Section):
    enabled: Annotated[
        bool,
        Meta(
            description=(
                "Run the maintenance loop inside `memory-mcp serve` (re-embed, consolidate, "
                "insights, staleness, purge, secrets). `memory-mcp maintain` runs it on demand "
                "either way."
            )
        ),
    ] = True
    interval_minutes: Annotated[
        float,
        Meta(
            ge=1,
            description=(
                "Minutes between two runs of the consolidation sweep, insights, staleness and "
                "purge. Re-embedding runs whenever records await vectors."
            ),
        ),
    ] = 60.0
    check_seconds: Annotated[
        float, Meta(ge=1, description="How often the server's loop looks for a task that is due.")
    ] = 60.0
    sweep_facts: Annotated[
        int,
        Meta(
            ge=1,
            description=(
                "Most facts one consolidation run of the server's loop compares; the rest waits "
                "for the next check, so a first sweep of a large store comes in slices."
            ),
        ),
    ] = 1000
    lease_seconds: Annotated[
        int,
        Meta(
            ge=30,
            description=(
                "How long a task's lease lasts before another process may take it over; a running "
                "task renews it between batches."
            ),
        ),
    ] = 600
    retry_minutes: Annotated[
        float,
        Meta(
            gt=0,
            description="First wait after a task fails (an embedder outage); it doubles each time.",
        ),
    ] = 5.0
    retry_max_minutes: Annotated[
        float, Meta(gt=0, description="Longest wait between two attempts of a failing task.")
    ] = 360.0
    consolidate: Annotated[
        bool,
        Meta(
            description=(
                "Fold the duplicates the write-time fold missed, across each whole project, with "
                "the same rules ([fold]); contradictions become conflicts."
            )
        ),
    ] = True
    insights: Annotated[
        bool, Meta(description="Write insights: summaries of groups of related facts.")
    ] = True
    insight_similarity: Annotated[
        float,
        Meta(
            ge=0,
            le=1,
            description="Cosine similarity from which two facts belong to one insight's group.",
        ),
    ] = 0.6
    insight_min_facts: Annotated[
        int, Meta(ge=2, description="Fewest facts an insight summarizes.")
    ] = 3
    insight_max_facts: Annotated[
        int, Meta(ge=2, description="Most facts one insight summarizes.")
    ] = 12
    dormant_days: Annotated[
        int,
        Meta(
            description=(
                "A project with no write or search for this many days is dormant: its facts never "
                "returned by a search are archived (reason dormant). Negative: never."
            )
        ),
    ] = 90
    stale_days: Annotated[
        int, Meta(ge=0, description="Only facts older than this many days are archived as dormant.")
    ] = 30
    grace_days: Annotated[
        float,
        Meta(
            ge=0,
            description=(
                "Archived records are purged (deleted for good) this many days after they were "
                "archived; until then `memory-mcp restore` brings them back."
            ),
        ),
    ] = 30.0
    llm_base_url: Annotated[
        str,
        Meta(
            description=(
                "OpenAI-compatible chat endpoint that refines the text of consolidated memories "
                "and writes insights, e.g. http://127.0.0.1:11434/v1. Empty: not used."
            )
        ),
    ] = ""
    llm_model: Annotated[str, Meta(description="Model name sent to the chat endpoint.")] = ""
    llm_api_key: Annotated[
        str, Meta(description="Bearer key for the chat endpoint (prefer the environment variable).")
    ] = ""
    llm_command: Annotated[
        str,
        Meta(
            description=(
                "Command that refines instead of an endpoint, e.g. `claude -p {prompt}` or "
                "`codex exec {prompt}`: {prompt} becomes one argument (no shell); without it the "
                "prompt goes to standard input. The answer is its standard output. Empty: not used."
            )
        ),
    ] = ""
    llm_timeout: Annotated[
        float,
        Meta(gt=0, description="Seconds before an LLM call is abandoned (the text stays as is)."),
    ] = 120.0

    def __post_init__(self) -> None:
        if self.llm_command.strip():
            try:
                if not shlex.split(self.llm_command):
                    raise ValueError("it names no command")
            except ValueError as exc:
                raise ValueError(
                    f"llm_command {self.llm_command!r} does not parse as a command: {exc}"
                ) from exc
        if self.insight_min_facts > self.insight_max_facts:
            raise ValueError("insight_min_facts is larger than insight_max_facts")
        if self.retry_minutes > self.retry_max_minutes:
            raise ValueError("retry_minutes is larger than retry_max_minutes")


class Settings(_Section):
    data_dir: Annotated[
        str,
        Meta(
            description=(
                "Directory of the memory database (memory.db). Empty: the user data directory "
                "(~/.local/share/memory-mcp on Linux)."
            )
        ),
    ] = ""
    embedder: EmbedderSettings = msgspec.field(default_factory=EmbedderSettings)
    write: WriteSettings = msgspec.field(default_factory=WriteSettings)
    fold: FoldSettings = msgspec.field(default_factory=FoldSettings)
    search: SearchSettings = msgspec.field(default_factory=SearchSettings)
    ranking: RankingSettings = msgspec.field(default_factory=RankingSettings)
    storage: StorageSettings = msgspec.field(default_factory=StorageSettings)
    brief: BriefSettings = msgspec.field(default_factory=BriefSettings)
    serve: ServeSettings = msgspec.field(default_factory=ServeSettings)
    maintenance: MaintenanceSettings = msgspec.field(default_factory=MaintenanceSettings)

    def database_path(self, env: Mapping[str, str] | None = None) -> Path:
        """Where the SQLite database lives (for a process with environment ``env``):
        the file a ``sqlite:///`` ``storage.url`` names, else memory.db in ``data_dir``."""
        from memory_mcp.storage.factory import sqlite_path

        base = Path(self.data_dir).expanduser() if self.data_dir else dirs.data_dir(env)
        return sqlite_path(self.storage.url.strip(), base / "memory.db")


# Sections a project's own config file may set (it travels with the repository).
PROJECT_SECTIONS = frozenset({"write", "fold", "search", "ranking", "brief"})


@dataclass(frozen=True)
class SettingInfo:
    """One setting, as documented."""

    section: str  # "" for top-level keys
    key: str
    default: Any
    description: str
    annotation: Any = None  # the field's type, as declared

    @property
    def choices(self) -> tuple[str, ...]:
        """The values a ``Literal`` setting takes (none for any other)."""
        kind = self.annotation
        while get_origin(kind) is Annotated:
            kind = get_args(kind)[0]
        return tuple(str(c) for c in get_args(kind)) if get_origin(kind) is Literal else ()

    @property
    def env_var(self) -> str:
        parts = [self.section, self.key] if self.section else [self.key]
        return ENV_PREFIX + "_".join(parts).upper()

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}" if self.section else self.key


def iter_settings() -> Iterator[SettingInfo]:
    """Every setting with its section, default and help string."""
    for top in msgspec.structs.fields(Settings):
        if isinstance(top.type, type) and issubclass(top.type, _Section):
            for sub in msgspec.structs.fields(top.type):
                yield SettingInfo(top.name, sub.name, sub.default, _help(sub.type), sub.type)
        else:
            yield SettingInfo("", top.name, top.default, _help(top.type), top.type)


def _help(annotation: Any) -> str:
    """The description in a field's ``Annotated[..., Meta(description=...)]``."""
    if get_origin(annotation) is Annotated:
        for extra in get_args(annotation)[1:]:
            if isinstance(extra, Meta) and extra.description:
                return extra.description
    return ""


SectionT = TypeVar("SectionT", bound=_Section)


def validate(kind: type[SectionT], data: Mapping[str, Any]) -> SectionT:
    """Settings of ``kind`` from plain data (TOML values, or strings from the environment).

    Raises:
        msgspec.ValidationError: a value has the wrong type or range, or a key is unknown.
    """
    return msgspec.convert(data, type=kind, strict=False)


def replaced(section: SectionT, **changes: Any) -> SectionT:
    """A copy of ``section`` with ``changes``, validated as a whole.

    Raises:
        ConfigError: a changed value is invalid (the message names it).
    """
    try:
        return validate(type(section), {**msgspec.structs.asdict(section), **changes})
    except msgspec.ValidationError as exc:
        raise ConfigError(describe_errors(exc)) from None


@dataclass
class LoadedSettings:
    """Settings plus where they came from (shown by ``status``)."""

    settings: Settings
    sources: list[str] = field(default_factory=list)


def user_config_path(env: Mapping[str, str]) -> Path:
    """The user config file: ``$MEMORY_MCP_CONFIG``, else the platform config dir."""
    explicit = env.get(USER_CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    return dirs.config_dir(env) / "config.toml"


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
        data = _read_toml(user_file)
        if "project" in data:
            raise ConfigError(
                f"{user_file} sets project; a project's id belongs in its own "
                f"{PROJECT_CONFIG_NAME} (the [project] section), not in the user config file"
            )
        _merge(merged, data)
        sources.append(str(user_file))
    elif env.get(USER_CONFIG_ENV):
        raise ConfigError(f"{USER_CONFIG_ENV} names {user_file}, which is not a file")

    if project_root is not None:
        project_file = project_root / PROJECT_CONFIG_NAME
        if project_file.is_file():
            data = _read_toml(project_file)
            data.pop("project", None)  # the project's identity: read by identity.identify
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
        return LoadedSettings(validate(Settings, merged), sources)
    except msgspec.ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None


BOOLEAN_WORDS = {
    **dict.fromkeys(("true", "yes", "on", "1"), True),
    **dict.fromkeys(("false", "no", "off", "0"), False),
}


def _env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    by_var = {info.env_var: info for info in iter_settings()}
    layer: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in (USER_CONFIG_ENV, dirs.CACHE_ENV):
            continue
        info = by_var.get(name)
        if info is None:
            raise ConfigError(
                f"unknown environment variable {name}; see config.example.toml for the settings"
            )
        value: Any = raw.strip()
        if not value or value in (f"${name}", f"${{{name}}}"):
            # Unset in effect: empty, or a CLI's "${NAME}" for a variable it does not have
            # (the value must not override the config file's with the placeholder).
            continue
        if isinstance(info.default, bool):
            value = BOOLEAN_WORDS.get(value.casefold(), value)
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


def describe_errors(exc: msgspec.ValidationError) -> str:
    """A validation error as ``where: what`` (``ranking.prior_weight: Expected ...``)."""
    message, found, where = str(exc).rpartition(" - at `$")
    if not found:  # the top level
        message, path = str(exc), ""
    else:
        path = where.rstrip("`").lstrip(".")
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", message)
    if unknown:
        return f"{path + '.' if path else ''}{unknown.group(1)}: unknown setting"
    choices = _choices(path)
    if choices:
        message += f"; use one of: {', '.join(choices)}"
    return f"{path}: {message}" if path else message


def _choices(path: str) -> tuple[str, ...]:
    """The values a ``Literal`` setting at ``path`` (``embedder.backend``) takes."""
    return next((info.choices for info in iter_settings() if info.dotted == path), ())


def _describe(exc: msgspec.ValidationError, sources: list[str]) -> str:
    return "invalid settings (" + ", ".join(sources) + "): " + describe_errors(exc)
