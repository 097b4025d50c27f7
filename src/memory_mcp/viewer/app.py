"""The viewer's web app: server-rendered pages over ``MemoryService``, behind ``Guard``.

Every page is HTML rendered by Jinja2 with autoescaping on and no template
marking anything safe: a memory is untrusted text and shows as text. No page
has a script; a change is a form's POST, answered with a redirect to the page
it came from (so reloading never repeats it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from memory_mcp import __version__
from memory_mcp.agents.inject import AGENTS, injected, prompt_file
from memory_mcp.agents.install import inspect
from memory_mcp.errors import InvalidInput, MemoryMcpError, NotFound
from memory_mcp.mcp.tokens import CALLER_KEY, Caller, Tokens
from memory_mcp.records import CORPORA, CORPUS_OF_KIND, Record, set_aside_by
from memory_mcp.scope import GLOBAL_KEY, project_label
from memory_mcp.service import MemoryService

if TYPE_CHECKING:
    from memory_mcp.curation import ProjectSummary
from memory_mcp.viewer import charts as charts_module
from memory_mcp.viewer.charts import month_bars
from memory_mcp.viewer.guard import (
    COOKIE,
    CSRF_FIELD,
    ICON,
    SESSION_KEY,
    SIGN_IN,
    STARTED_KEY,
    Guard,
    Sessions,
)
from memory_mcp.viewer.guard import ASGIApp as GuardedApp

PAGE = 50  # records a page lists
HITS = 50  # search hits a page shows
KEEPS = ("new", "old", "both", "merged")  # a conflict's resolutions (``KEEP_SAYS``)
# What a page says after a change (``?done=``, with ``n``: a conflict's number): fixed
# sentences, never text from the URL.
NOTICES = {
    "archived": "Archived: Restore brings it back until the purge.",
    "restored": "Restored: it is current again.",
    "restored-history": "Restored: it is history again, replaced by the value after it.",
    "reopened": "Restored: it contradicts a current memory again, so conflict #{n} is open again.",
    "unfolded": (
        "Fold undone: the text is its own memory again, and maintenance will not fold "
        "the two together again."
    ),
    "reinstated": "This is the current value again; the value that replaced it is its history.",
    "resolved-new": "Conflict #{n} resolved: the newer memory is kept; the older is its history.",
    "resolved-old": (
        "Conflict #{n} resolved: the older memory is kept; the newer is archived (Archived "
        "has it, with Restore)."
    ),
    "resolved-both": "Conflict #{n} resolved: both memories stay current.",
    "resolved-merged": "Conflict #{n} resolved: one new memory replaces both.",
}
KEEP_SAYS = {  # what each resolution does, beside its button
    "new": "the older becomes the newer's history",
    "old": "the newer is archived (restorable)",
    "both": "both stay current",
    "merged": "a new memory with your text replaces both",
}


@dataclass(frozen=True)
class Delivery:
    """How one CLI gets a project's brief, as far as the viewer can tell."""

    agent: str
    file: str  # its prompt file's name ("" where the project's files are not known)
    injected: bool  # `inject` wrote the block in that file
    known: bool  # the project's files and the CLI's configs were read (`ui` runs in it)
    hooks: list[str]  # install scopes holding its SessionStart hook
    server: bool  # its MCP server is registered


@dataclass
class Viewer:
    """What every page handler needs: the service, the templates, the sessions."""

    memory: MemoryService
    sessions: Sessions
    tokens: Tokens
    prefix: str
    root: Path | None  # the directory `ui` was started in: its project's files
    runs_tasks: bool  # whether this process runs maintenance (`serve` with it enabled)

    def __post_init__(self) -> None:
        self.templates = Environment(
            loader=PackageLoader("memory_mcp.viewer", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["when"] = when
        self.templates.filters["why_archived"] = why_archived

    @contextlib.contextmanager
    def acting(self, request: Request) -> Iterator[None]:
        """The request's caller's view of the store (their personal records only)."""
        caller = request.scope.get(CALLER_KEY)
        user = caller.user if isinstance(caller, Caller) else None
        with MemoryService.acting_as(user):
            yield

    def url(self, path: str, **query: Any) -> str:
        """A link to ``path`` here (quoted: a record id is any text) with ``query``'s
        non-empty values."""
        wanted = {k: v for k, v in query.items() if v not in (None, "", ())}
        where = self.prefix + quote(path, safe="/")
        return where + (f"?{urlencode(wanted, doseq=True)}" if wanted else "")

    def render(self, request: Request, name: str, code: int = 200, **values: Any) -> Response:
        started = request.scope.get(STARTED_KEY, time.perf_counter())
        template = self.templates.get_template(name)
        html = template.render(
            url=self.url,
            csrf=self.sessions.form_token(request.scope.get(SESSION_KEY, "")),
            csrf_session=bool(request.scope.get(SESSION_KEY)),
            csrf_field=CSRF_FIELD,
            signed_in=self.tokens.required,
            version=__version__,
            scope_name=project_label,
            notice=notice(request.query_params.get("done", ""), request.query_params.get("n", "")),
            elapsed=lambda: f"{(time.perf_counter() - started) * 1000:.0f} ms",
            **values,
        )
        return HTMLResponse(html, status_code=code)


def when(stored: str | None, empty: str = "") -> str:
    """A stored time (ISO 8601, UTC, to the microsecond) as a page shows it:
    ``2026-01-05 09:00 UTC``."""
    return f"{stored[:16].replace('T', ' ')} UTC" if stored else empty


def why_archived(reason: str | None) -> str:
    """An archive reason as people read it: ``conflict-3`` is the conflict's resolution."""
    number = set_aside_by(reason)
    if number is not None:
        return f"set aside when conflict #{number} was resolved"
    return reason or ""


def done(target: str, what: str, number: int | None = None) -> str:
    """``target`` (a local URL) with the notice of ``what`` was done (``NOTICES``) to
    conflict ``number``."""
    given = f"done={what}" + (f"&n={number}" if number is not None else "")
    return f"{target}{'&' if '?' in target else '?'}{given}"


def notice(what: str, number: str) -> str | None:
    """The sentence a page shows after a change, if the query names one."""
    sentence = NOTICES.get(what)
    if sentence is None or ("{n}" in sentence and not (number.isdigit() and len(number) < 19)):
        return None
    return sentence.format(n=number)


def build_app(
    memory: MemoryService,
    *,
    tokens: Tokens,
    security: TransportSecuritySettings,
    prefix: str = "",
    root: Path | None = None,
    runs_tasks: bool = False,
) -> GuardedApp:
    """The viewer as an ASGI app, serving under ``prefix`` ("" or "/ui"); ``runs_tasks``
    says whether the process serving it runs maintenance (the page says who does)."""
    viewer = Viewer(memory, Sessions(), tokens, prefix, root, runs_tasks)
    pages = Pages(viewer)
    routes = [
        Route("/", pages.projects),
        Route(ICON, pages.favicon),
        Route(SIGN_IN, pages.sign_in, methods=["GET", "POST"]),
        Route("/sign-out", pages.sign_out, methods=["POST"]),
        Route("/project", pages.project),
        Route("/record/{record_id}", pages.record),
        Route("/record/{record_id}/forget", pages.forget, methods=["POST"]),
        Route("/record/{record_id}/reinstate", pages.reinstate, methods=["POST"]),
        Route("/restore", pages.restore, methods=["POST"]),
        Route("/conflicts", pages.conflicts),
        Route("/conflicts/{conflict_id:int}", pages.resolve, methods=["POST"]),
        Route("/archived", pages.archived),
        Route("/brief", pages.brief),
        Route("/maintenance", pages.maintenance),
        Mount("/static", StaticFiles(packages=[("memory_mcp.viewer", "static")]), name="static"),
    ]
    app = Starlette(routes=[Mount(prefix, routes=routes)] if prefix else routes)
    app.add_exception_handler(MemoryMcpError, pages.failed)  # type: ignore[arg-type]
    return Guard(app, tokens=tokens, security=security, sessions=viewer.sessions, prefix=prefix)


class Pages:
    """One method per route."""

    def __init__(self, viewer: Viewer) -> None:
        self.v = viewer
        self.memory = viewer.memory
        self.counted: tuple[object, str, list[ProjectSummary]] | None = None

    async def failed(self, request: Request, exc: MemoryMcpError) -> Response:
        status = 404 if isinstance(exc, NotFound) else 400
        return self.v.render(request, "error.html", code=status, message=str(exc))

    async def sign_in(self, request: Request) -> Response:
        wanted = request.query_params.get("next", "")
        after = wanted if _local(wanted) and wanted.startswith(self.v.prefix + "/") else ""
        if request.method == "GET":
            return self.v.render(request, "sign_in.html", failed=False, after=after)
        form = await request.form()
        token = _text(form, "token")
        if self.v.tokens.caller(token) is None:
            return self.v.render(request, "sign_in.html", code=401, failed=True, after=after)
        response = RedirectResponse(after or self.v.url("/"), status_code=303)
        response.set_cookie(
            COOKIE,
            self.v.sessions.open(token),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path=self.v.prefix or "/",
        )
        return response

    async def sign_out(self, request: Request) -> Response:
        self.v.sessions.close(request.scope.get(SESSION_KEY, ""))
        response = RedirectResponse(self.v.url(SIGN_IN), status_code=303)
        response.delete_cookie(COOKIE, path=self.v.prefix or "/")
        return response

    async def projects(self, request: Request) -> Response:
        with self.v.acting(request):
            # Counting a project's records reads all of them (290 ms at 200,000): kept
            # until the next commit (the store's write mark says when that is).
            mark, user = await self.memory.write_mark(), self.memory.user
            cached = self.counted
            if mark is not None and cached is not None and cached[:2] == (mark, user):
                found = cached[2]
            else:
                found = await self.memory.projects()
                self.counted = (mark, user, found)
        charts = {p.key: month_bars(p.by_month) for p in found}
        return self.v.render(
            request,
            "projects.html",
            projects=found,
            charts=charts,
            chart_width=charts_module.WIDTH,
            chart_height=charts_module.HEIGHT,
            bar_width=charts_module.BAR - 1,
        )

    async def project(self, request: Request) -> Response:
        query = request.query_params
        key = query.get("key", GLOBAL_KEY)
        text = query.get("q", "").strip()
        kind, agent, tag = query.get("kind", ""), query.get("agent", ""), query.get("tag", "")
        since, until = query.get("since", ""), query.get("until", "")
        before, seen = query.get("before", ""), query.getlist("seen")
        shown = {"key": key, "q": text, "kind": kind, "agent": agent, "tag": tag}
        shown |= {"since": since, "until": until}
        with self.v.acting(request):
            keys = await self.memory.project_keys(key)
            try:
                hits, records, mode, warnings = await self._find(keys, shown, before, seen)
            except InvalidInput as exc:  # the page again, its filters kept, saying what to fix
                return self._project_page(request, shown, keys, error=str(exc))
            marked = await self.memory.conflicts_of([r.id for r in records])
        more, records = len(records) > PAGE, records[:PAGE]
        next_url = ""
        if more:  # the next page starts after the last record shown (``curation.listing``)
            last = records[-1].created_at
            at_last = [r.id for r in records if r.created_at == last]
            if last == before:  # a run of records written at one time spans pages
                at_last = [*seen, *at_last]
            next_url = self.v.url("/project", **shown, before=last, seen=at_last)
        return self._project_page(
            request,
            shown,
            keys,
            hits=hits,
            records=records,
            conflicts=marked,
            paged=bool(before),
            mode=mode,
            warnings=warnings,
            next_url=next_url,
            first_url=self.v.url("/project", **shown) if before else "",
        )

    def _project_page(
        self, request: Request, shown: dict[str, str], keys: tuple[str, ...], **values: Any
    ) -> Response:
        error = values.get("error")
        return self.v.render(
            request,
            "project.html",
            code=400 if error else 200,
            key=shown["key"],
            keys=keys,
            asked=shown,
            kinds=list(CORPUS_OF_KIND),
            **({"hits": [], "records": [], "conflicts": {}} | values),
        )

    async def _find(
        self, keys: tuple[str, ...], shown: dict[str, str], before: str, seen: list[str]
    ) -> tuple[list[Any], list[Record], str, list[str]]:
        """The hits of a search (a project's: with the global scope's, as an agent's
        search in the project reads them), or a page of the listing (one more than
        shown: is there a next page); the search's mode and warnings."""
        text, kind, agent = shown["q"], shown["kind"], shown["agent"]
        tag = shown["tag"].removeprefix("#")  # as pages show tags
        since, until = shown["since"], shown["until"]
        if text:
            result = await self.memory.search(
                text,
                keys=(*keys, GLOBAL_KEY) if GLOBAL_KEY not in keys else keys,
                corpora=CORPORA,  # a kind names its corpus (``search.search`` checks it)
                kinds=(kind,) if kind else (),
                tags=(tag,) if tag else (),
                agents=(agent,) if agent else (),
                since=since or None,
                until=until or None,
                limit=HITS,
                max_limit=HITS,
                count_access=False,
            )
            return result.hits, [], result.mode, result.warnings
        records = await self.memory.listing(
            keys,
            kind=kind,
            agent=agent,
            tag=tag,
            since=since,
            until=until,
            limit=PAGE + 1,
            before=before,
            seen=seen,
        )
        return [], records, "", []

    async def favicon(self, request: Request) -> Response:
        icon = resources.files("memory_mcp.viewer").joinpath("static/favicon.svg")
        return Response(icon.read_bytes(), media_type="image/svg+xml")

    async def record(self, request: Request) -> Response:
        with self.v.acting(request):
            record = await self.memory.readable(request.path_params["record_id"])
            history = await self.memory.history(record)
        return self.v.render(request, "record.html", record=record, history=history)

    async def forget(self, request: Request) -> Response:
        form = await request.form()
        record_id = request.path_params["record_id"]
        with self.v.acting(request):
            await self.memory.readable(record_id)
            await self.memory.forget(record_id, reason=_text(form, "reason") or "archived")
        return RedirectResponse(done(self.v.url(f"/record/{record_id}"), "archived"), 303)

    async def reinstate(self, request: Request) -> Response:
        record_id = request.path_params["record_id"]
        with self.v.acting(request):
            await self.memory.reinstate(record_id)
        return RedirectResponse(done(self.v.url(f"/record/{record_id}"), "reinstated"), 303)

    async def restore(self, request: Request) -> Response:
        form = await request.form()
        ids = [str(i) for i in form.getlist("id") if str(i).strip()]
        with self.v.acting(request):
            reasons = {(await self.memory.readable(i)).archived_reason for i in ids}
            restored = await self.memory.restore(ids)
            reopened = await self.memory.conflicts_of(ids)
        back = _text(form, "back")
        back = back if _local(back) else self.v.url("/archived")
        if reopened and any(set_aside_by(r) is not None for r in reasons):
            return RedirectResponse(done(back, "reopened", min(reopened.values())), 303)
        if reasons == {"folded"}:
            return RedirectResponse(done(back, "unfolded"), 303)
        history = any(r.replaced_by for r in restored)
        return RedirectResponse(done(back, "restored-history" if history else "restored"), 303)

    async def conflicts(self, request: Request, error: str = "") -> Response:
        with self.v.acting(request):
            views = [
                replace(view, new=new, old=old)
                for view in await self.memory.conflicts()
                for new, old in [(self._shown(view.new), self._shown(view.old))]
            ]
        return self.v.render(
            request,
            "conflicts.html",
            code=400 if error else 200,
            conflicts=views,
            says=KEEP_SAYS,
            error=error,
        )

    def _shown(self, record: Record | None) -> Record | None:
        return None if record is None else self.memory.shown([record])[0]

    async def resolve(self, request: Request) -> Response:
        form = await request.form()
        keep = _text(form, "keep")
        if request.path_params["conflict_id"] >= 1 << 62:  # no such conflict (nor SQLite int)
            raise NotFound(f"no conflict #{request.path_params['conflict_id']}")
        if keep not in KEEPS:
            raise InvalidInput(f"keep must be one of {', '.join(KEEPS)}")
        number, text = request.path_params["conflict_id"], _text(form, "text")
        if keep == "merged" and not text:
            return await self.conflicts(
                request, f"conflict #{number}: write the text that replaces both, then Merge"
            )
        try:
            with self.v.acting(request):
                await self.memory.resolve_conflict(
                    number,
                    keep,  # type: ignore[arg-type]
                    text or None,
                    agent="viewer",
                )
        except InvalidInput as exc:  # the inbox again, saying why (changed meanwhile, …)
            return await self.conflicts(request, f"conflict #{number}: {exc}")
        return RedirectResponse(done(self.v.url("/conflicts"), f"resolved-{keep}", number), 303)

    async def archived(self, request: Request) -> Response:
        key = request.query_params.get("key")
        if request.query_params.get("global"):  # the global scope's key is ""
            key = GLOBAL_KEY
        offset = _count(request.query_params.get("from", "0"), "from")
        with self.v.acting(request):
            keys = await self.memory.project_keys(key) if key is not None else ()
            found = await self.memory.archived(keys, limit=PAGE + 1, offset=offset)
            user = self.memory.user
        records = self.memory.shown([r for r in found[:PAGE] if r.visible_to(user)])
        scope = {"global": 1} if key == GLOBAL_KEY else {}
        more = len(found) > PAGE
        return self.v.render(
            request,
            "archived.html",
            records=records,
            key=key,
            next_url=self.v.url("/archived", key=key, **{"from": offset + PAGE}, **scope)
            if more
            else "",
            first_url=self.v.url("/archived", key=key, **scope) if offset else "",
        )

    async def brief(self, request: Request) -> Response:
        key = request.query_params.get("key", GLOBAL_KEY)
        if key == GLOBAL_KEY:
            raise InvalidInput(
                "the global scope has no brief of its own: each project's brief carries "
                "its global facts (open a project's brief)"
            )
        with self.v.acting(request):
            brief = await self.memory.project_brief(key)
            left_out = await self.memory.records(brief.left_out)
            # Prompt files are read only where they are known: the project `ui` runs in.
            root = self.v.root if self.v.root is not None and await self._runs_in(key) else None
        deliveries = []
        setups = {s.agent: s for s in inspect(root)} if root is not None else {}
        for agent in AGENTS:
            file = prompt_file(root, agent) if root is not None else None
            setup = setups.get(agent)
            deliveries.append(
                Delivery(
                    agent,
                    file.name if file is not None else "",
                    root is not None and injected(root, agent),
                    known=setup is not None,
                    hooks=list(setup.hooks) if setup else [],
                    server=bool(setup and setup.servers),
                )
            )
        return self.v.render(
            request,
            "brief.html",
            key=key,
            brief=brief,
            left_out=left_out,
            deliveries=deliveries,
        )

    async def _runs_in(self, key: str) -> bool:
        """Whether ``key`` is the project of the directory the viewer was started in."""
        return (await self.memory.project(self.v.root)).key == key

    async def maintenance(self, request: Request) -> Response:
        status = await self.memory.upkeep()
        return self.v.render(
            request, "maintenance.html", status=status, runs_tasks=self.v.runs_tasks
        )


def _count(value: str, name: str) -> int:
    if not (value.isascii() and value.isdigit() and len(value) <= 9):
        raise InvalidInput(f"{name} must be a whole number below a billion, got {value!r}")
    return int(value)


def _text(form: FormData, name: str) -> str:
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def _local(target: str) -> bool:
    """Whether a redirect target stays on this server (a path, not a URL; browsers drop
    tabs and line breaks from a URL, so ``/\t/host`` would lead away)."""
    return (
        target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and all(ord(c) > 0x20 for c in target)
    )
