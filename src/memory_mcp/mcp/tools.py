"""The MCP server: five tools over the engine, for every agent CLI.

``build_server(memory)`` makes an ``MCPServer`` whose tools each validate their
arguments, call one ``MemoryService`` method and return a pydantic model
(structured output). The service is opened once per process by the caller
(``memory-mcp serve``), so every connection - one stdio client, or many over
HTTP - shares one store and one loaded model.

Which project a call is about: the tool's ``cwd`` argument, else the client's
first root (``roots/list``, asked only when the client declares roots), else the
server process's working directory. Nothing here assumes one project per process.

Who wrote a memory comes from the client's ``clientInfo.name`` (``agent_name``).

Every engine error (``MemoryMcpError``) becomes a tool error with the engine's
message, which says what to change; the server stays up and, since each write
is one transaction, nothing is half-written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.resolve import ListRoots, Resolve
from mcp.server.mcpserver.tools import Tool
from mcp_types import ListRootsResult, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from memory_mcp import __version__, views
from memory_mcp.errors import InvalidInput, MemoryMcpError
from memory_mcp.mcp.tokens import CALLER_KEY, Caller
from memory_mcp.records import SearchResult
from memory_mcp.scope import resolve_cwd
from memory_mcp.service import MemoryService, UnifiedItem

log = logging.getLogger(__name__)
T = TypeVar("T")
ToolFn = TypeVar("ToolFn", bound=Callable[..., Awaitable[Any]])

INSTRUCTIONS = (
    "Project memory shared by every coding agent. Store durable lessons with memory_store "
    "(decisions, conventions, gotchas, what you did as kind=journal); look things up with "
    "project_search or memory_search before asking the user or re-discovering them."
)

# Names an agent CLI gives itself in clientInfo, by prefix, and the agent it stands for.
_KNOWN_CLIENTS: tuple[tuple[str, str], ...] = (
    ("claude", "claude"),
    ("codex", "codex"),
    ("gemini", "gemini"),
)


def agent_name(client_name: str | None) -> str:
    """The provenance name of a client: claude, codex, gemini, else what it calls itself."""
    name = (client_name or "").strip()
    if not name:
        return "unknown"
    folded = name.casefold()
    for prefix, agent in _KNOWN_CLIENTS:
        if folded.startswith(prefix):
            return agent
    return name


def root_path(uri: str) -> Path:
    """The local directory of a ``file://`` root URI."""
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise InvalidInput(
            f"the client's root {uri!r} is not a file:// URI; pass cwd (an absolute directory)"
        )
    if parsed.netloc not in ("", "localhost"):
        raise InvalidInput(
            f"the client's root {uri!r} is on another host; pass cwd (an absolute directory)"
        )
    return Path(url2pathname(unquote(parsed.path)))


# Tool results. Every agent pays for the tools/list answer on every turn, so fields
# are few and never nullable (``compact_schema`` drops titles and nullable wrappers).


class Stored(BaseModel):
    id: str
    action: str
    related_id: str = ""
    related_content: str = ""
    conflict_id: int = 0
    redacted: list[str] = []
    reason: str = ""


class Found(BaseModel):
    id: str
    content: str
    corpus: str
    kind: str
    score: float
    agent: str
    created_at: str
    meta: dict[str, Any] = {}


class Results(BaseModel):
    results: list[Found]
    mode: str
    warnings: list[str] = []


class UnifiedHit(BaseModel):
    type: str
    id: str
    content: str
    similarity: float
    metadata: dict[str, Any]


class UnifiedResults(BaseModel):
    results: list[UnifiedHit]
    warnings: list[str] = []


class BriefOut(BaseModel):
    brief: str
    tokens: int


class Forgotten(BaseModel):
    id: str
    archived_at: str
    reason: str


def _results(result: SearchResult) -> Results:
    return Results.model_validate(views.results(result))


def _unified(item: UnifiedItem) -> UnifiedHit:
    return UnifiedHit(
        type=item.type,
        id=item.id,
        content=item.content,
        similarity=item.similarity,
        metadata=item.metadata,
    )


async def _roots_if_needed(cwd: str | None, ctx: Context) -> ListRoots | None:
    """Ask the client for its roots if it has any: they give the project when the call
    names no cwd, and confine the cwd it names."""
    del cwd
    capabilities = ctx.client_capabilities
    if capabilities is None or capabilities.roots is None:
        return None
    return ListRoots()


Roots = Annotated[ListRootsResult | None, Resolve(_roots_if_needed)]
Cwd = Annotated[
    str | None,
    Field(description="Absolute project dir; default: client root, else server cwd."),
]
Query = Annotated[str, Field(description="What to look for.")]


def working_directory(cwd: str | None, roots: ListRootsResult | None) -> str | None:
    """The directory a call is about: ``cwd``, else the first root, else None (process cwd).

    A client that declares roots confines ``cwd`` to them (symlinks and ``..``
    resolved), so that a tool call cannot reach another project's memory.
    """
    if cwd:
        if roots is not None and roots.roots:
            _inside_roots(cwd, roots)
        return cwd
    if roots is not None and roots.roots:
        path = root_path(str(roots.roots[0].uri))
        if not path.is_dir():
            raise InvalidInput(
                f"the client's root {str(path)!r} is not a directory on the server's machine; "
                "pass cwd (an absolute directory)"
            )
        return str(path)
    return None


def _inside_roots(cwd: str, roots: ListRootsResult) -> None:
    """Refuse a cwd outside every root that is a directory on this machine.

    Roots of another host, or paths this machine does not have (a client in a
    container, a remote one), confine nothing: with none left, any cwd goes.
    """
    local = []
    for root in roots.roots:
        try:
            top = root_path(str(root.uri))
            if top.is_dir():
                local.append(os.path.normcase(os.path.realpath(top)))
        except (InvalidInput, OSError):
            continue
    if not local:
        return
    where = os.path.normcase(os.path.realpath(resolve_cwd(cwd)))
    if not any(os.path.commonpath([where, top]) == top for top in local):
        raise InvalidInput(
            f"cwd {cwd!r} is outside the client's roots; pass a directory inside the project"
        )


@contextmanager
def _tool_errors() -> Iterator[None]:
    """An engine error becomes a tool error with the engine's message."""
    try:
        yield
    except MemoryMcpError as exc:
        raise ToolError(str(exc)) from exc
    except UnicodeEncodeError as exc:  # a text the engine let through that SQLite cannot hold
        raise ToolError(
            "an argument holds characters that cannot be stored (lone UTF-16 surrogates); "
            "remove them"
        ) from exc


def _where(cwd: str | None, roots: ListRootsResult | None) -> str | None:
    with _tool_errors():
        return working_directory(cwd, roots)


def acting_user(context: Any) -> str | None:
    """The user a request's bearer token names (``serve.tokens_file``), if any: whom the
    tool works for. stdio, and the shared ``serve.token``, name none (the store's user)."""
    try:
        request = context.request_context.request
    except (AttributeError, ValueError):  # no request: called in-process
        return None
    scope = getattr(request, "scope", None)
    caller = scope.get(CALLER_KEY) if isinstance(scope, dict) else None
    return caller.user if isinstance(caller, Caller) else None


def _caller(ctx: Context) -> str:
    params = ctx.session.client_params
    return agent_name(params.client_info.name if params is not None else None)


async def _call(work: Awaitable[T]) -> T:
    """Run engine work under ``_tool_errors``."""
    with _tool_errors():
        return await work


def compact_schema(schema: Any, *, nullable: bool = False) -> Any:
    """A JSON schema without pydantic's titles, for a tool's input or (``nullable``) output.

    ``additionalProperties: true`` (the default anyway) goes too. In an input
    schema an optional argument is advertised as its plain type with no default
    (absent means "not given"; the arguments model still accepts null). An
    output schema keeps its ``null`` arms but loses its defaults and its
    ``required`` lists: a result always carries every field, so they would say
    nothing (and every agent pays for them on every turn).
    """
    if isinstance(schema, list):
        return [compact_schema(item, nullable=nullable) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "$defs") and isinstance(value, dict):
            # A map of names to schemas: every name stays, whatever it is called.
            out[key] = {name: compact_schema(sub, nullable=nullable) for name, sub in value.items()}
        elif key == "title" or (key == "additionalProperties" and value is True):
            continue
        elif not (key in ("default", "required") and nullable):
            out[key] = compact_schema(value, nullable=nullable)
    arms = out.get("anyOf")
    if not nullable and isinstance(arms, list):
        kept = [arm for arm in arms if arm != {"type": "null"}]
        if len(kept) == 1 and len(kept) < len(arms):
            del out["anyOf"]
            out = {**kept[0], **out}
            if out.get("default", 0) is None:
                del out["default"]
    return out


# What a client may infer about each tool, so that Codex runs them without asking
# every time (it asks for a tool with no hints): searching only reads; storing only
# adds to the project's memory (never deletes, touches nothing outside it).
# memory_forget has none: archiving is the user's to approve.
READS = ToolAnnotations(read_only_hint=True)
WRITES_MEMORY = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)


_EXPECTED = {
    "string_type": "text",
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": 'a list (for example ["a"])',
    "dict_type": "an object",
}


def argument_errors(tool: str, errors: Sequence[Any]) -> str:
    """Pydantic's errors on a tool's arguments as one sentence a model can act on."""
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != tool) or "arguments"
        kind = error.get("type", "")
        given = error.get("input")
        shown = repr(given) if len(repr(given)) <= 40 else repr(given)[:39] + "…"
        if kind == "missing":
            parts.append(f"{where} is required")
        elif kind == "literal_error":
            choices = (error.get("ctx") or {}).get("expected", "")
            parts.append(f"{where} must be {choices}, got {shown}")
        elif kind in _EXPECTED:
            parts.append(f"{where} must be {_EXPECTED[kind]}, got {shown}")
        else:
            parts.append(f"{where}: {error.get('msg', 'is not valid')}")
    return f"{tool}: " + "; ".join(parts) + "."


class CheckedTool(Tool):
    """A tool whose bad arguments get one plain sentence, not pydantic's report.

    An unknown argument is refused too (pydantic would drop it silently, and the
    model would never learn that its ``content_type`` or ``text`` did nothing).
    """

    async def run(
        self, arguments: dict[str, Any], context: Any, convert_result: bool = False
    ) -> Any:
        known = self.parameters.get("properties", {})
        unknown = sorted(set(arguments) - set(known))
        if unknown:
            raise ToolError(
                f"{self.name}: unknown argument {unknown[0]!r}; it takes {', '.join(known)}."
            )
        try:
            with MemoryService.acting_as(acting_user(context)):
                return await super().run(arguments, context, convert_result)
        except UnexpectedToolError:
            raise
        except ToolError as exc:  # the SDK's, with its long prefix: say it plainly
            cause = exc.__cause__
            if isinstance(cause, ValidationError):  # the arguments did not validate
                raise ToolError(argument_errors(self.name, cause.errors())) from None
            if isinstance(cause, ToolError):  # the engine's own message
                raise ToolError(f"{self.name}: {cause}") from None
            raise


def build_server(memory: MemoryService) -> MCPServer[Any]:
    """The MCP server over an open ``MemoryService``."""
    tools: list[Tool] = []

    def tool(
        name: str | None = None, *, hints: ToolAnnotations | None = None
    ) -> Callable[[ToolFn], ToolFn]:
        def register(fn: ToolFn) -> ToolFn:
            made = CheckedTool.from_function(fn, name=name, annotations=hints)
            made.parameters = compact_schema(made.parameters)
            if made.fn_metadata.output_schema is not None:
                made.fn_metadata.output_schema = compact_schema(
                    made.fn_metadata.output_schema, nullable=True
                )
            tools.append(made)
            return fn

        return register

    @tool(hints=WRITES_MEMORY)
    async def memory_store(
        content: Annotated[str, Field(description="The durable point, in a sentence or two.")],
        ctx: Context,
        roots: Roots,
        kind: Annotated[
            str,
            Field(description="fact decision preference procedure gotcha journal goal plan"),
        ] = "fact",
        scope: Annotated[
            Literal["project", "global"],
            Field(description="global: only for what holds in every project."),
        ] = "project",
        importance: Annotated[
            float | None, Field(description="0 to 1 (default: inferred).")
        ] = None,
        tags: Annotated[list[str] | None, Field(description="Short labels.")] = None,
        private: Annotated[
            bool, Field(description="true: only this user will see it, never the team.")
        ] = False,
        cwd: Cwd = None,
    ) -> Stored:
        """Remember a project fact for every agent; near-duplicates fold."""
        where = _where(cwd, roots)
        result = await _call(
            memory.store(
                content,
                kind=kind,
                scope=scope,
                cwd=where,
                importance=importance,
                tags=tags or (),
                agent=_caller(ctx),
                private=private,
            )
        )
        return Stored.model_validate(views.stored(result))

    @tool(hints=READS)
    async def memory_search(
        query: Query,
        roots: Roots,
        scope: Annotated[
            Literal["project", "global", "all"], Field(description="all = project + global.")
        ] = "all",
        kinds: Annotated[list[str] | None, Field(description="Only these kinds.")] = None,
        tags: Annotated[list[str] | None, Field(description="Any of these tags.")] = None,
        since: Annotated[str | None, Field(description="ISO date or time.")] = None,
        until: Annotated[
            str | None,
            Field(description="ISO date (that whole day included) or time (excluded)."),
        ] = None,
        limit: Annotated[int, Field(description="1 to 50.")] = 8,
        cwd: Cwd = None,
    ) -> Results:
        """Search stored facts, decisions and conventions, best first."""
        where = _where(cwd, roots)
        result = await _call(
            memory.search(
                query,
                scope=scope,
                cwd=where,
                kinds=kinds or (),
                tags=tags or (),
                since=since,
                until=until,
                limit=limit,
            )
        )
        return _results(result)

    @tool(hints=READS)
    async def project_search(
        query: Query,
        roots: Roots,
        limit: Annotated[int, Field(description="1 to 50.")] = 8,
        cwd: Cwd = None,
    ) -> Results:
        """Search all project memory at once: facts, journal, goal/plan and docs."""
        where = _where(cwd, roots)
        result = await _call(memory.project_search(query, cwd=where, limit=limit))
        return _results(result)

    @tool(name="searchUnifiedMemory", hints=READS)
    async def search_unified_memory(
        query: Query,
        roots: Roots,
        sources: Annotated[
            list[str] | None, Field(description="Any of memory, insights, knowledge (default all).")
        ] = None,
        limit: Annotated[int, Field(description="1 to 20.")] = 8,
        threshold: Annotated[float, Field(description="Minimum similarity, 0 to 1.")] = 0.35,
        cwd: Cwd = None,
    ) -> UnifiedResults:
        """Search memory, insights and knowledge with one comparable similarity."""
        where = _where(cwd, roots)
        result = await _call(
            memory.unified_search(
                query, sources=sources, cwd=where, limit=limit, threshold=threshold
            )
        )
        return UnifiedResults(
            results=[_unified(i) for i in result.results], warnings=result.warnings
        )

    @tool()
    async def memory_forget(
        id: Annotated[str, Field(description="The record's id.")],
        roots: Roots,
        reason: Annotated[str, Field(description="Why it no longer holds.")] = "forgotten",
        cwd: Cwd = None,
    ) -> Forgotten:
        """Archive a memory that is wrong or obsolete (reversible)."""
        where = _where(cwd, roots)
        record = await _call(memory.forget(id, reason=reason, cwd=where, anywhere=False))
        return Forgotten.model_validate(views.forgotten(record))

    @tool(hints=READS)
    async def memory_brief(roots: Roots, cwd: Cwd = None) -> BriefOut:
        """The project's memory brief: goal, plan, key facts and recent work."""
        result = await _call(memory.brief(_where(cwd, roots)))
        return BriefOut(brief=result.text, tokens=result.tokens)

    return MCPServer(
        "memory-mcp",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
        tools=tools,
    )
