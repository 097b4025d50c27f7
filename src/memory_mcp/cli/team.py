"""``team``: a team's store and server — ``team init`` prepares a Postgres database,
``team add-user NAME`` gives a teammate a role in it, ``team token NAME`` a bearer
token for a shared HTTP server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from memory_mcp.cli.base import (
    CwdOption,
    JsonOption,
    engine_errors,
    err,
    out,
    print_json,
    settings_for,
    with_memory,
)
from memory_mcp.service import MemoryService

team_app = typer.Typer(
    help="A team's store and server: the database, its users, their tokens.",
    no_args_is_help=True,
)
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="The team database's storage.url (postgresql://…); default: storage.url of "
        "the settings.",
    ),
]


@team_app.command("init")
def init(
    url: Annotated[
        str | None,
        typer.Argument(help="The team database (postgresql://…); default: storage.url."),
    ] = None,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Prepare a Postgres database for a team: schema, row-level security, the group role
    of its members and their grants, the vector index. Run it as the database's owner
    (or an administrator); run again, it does what is missing."""

    async def use(memory: MemoryService) -> list[str]:
        return await memory.prepare_team()

    done = with_memory(cwd, use, storage_url=url)
    if as_json:
        print_json({"done": done})
        return
    for line in done:
        out.print(f"- {line}")
    err.print("ready: give each teammate a role with `memory-mcp team add-user NAME`")


@team_app.command("add-user")
def add_user(
    name: Annotated[str, typer.Argument(help="The teammate's database role (their user).")],
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Read the role's password from stdin (first line); default: none, for "
            "servers that authenticate otherwise (certificates, peer, a password set later).",
        ),
    ] = False,
    url: UrlOption = None,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Give NAME a login role in the team's database (or add an existing role to the team).
    They connect with it: what they store is theirs, their global and private memories
    stay theirs."""
    password = sys.stdin.readline().rstrip("\r\n") if password_stdin else None
    if password_stdin and not password:
        err.print("error: --password-stdin read no password")
        raise typer.Exit(2)

    async def use(memory: MemoryService) -> str:
        return await memory.add_member(name, password)

    what = with_memory(cwd, use, embeds=False, storage_url=url)
    if as_json:
        print_json({"user": name, "role": what})
        return
    out.print(f"{name}: role {what}" + (" (with the password given)" if password else ""))


@team_app.command("token")
def token(
    user: Annotated[str, typer.Argument(help="The user the token stands for.")],
    file: Annotated[
        Path | None,
        typer.Option(help="The tokens file (default: serve.tokens_file of the settings)."),
    ] = None,
    cwd: CwdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Give USER a new bearer token (replacing theirs): printed once, only its hash is kept."""
    from memory_mcp.mcp.tokens import add_token

    with engine_errors():
        configured = settings_for(cwd).settings.serve.tokens_file if file is None else ""
        if file is None and not configured:
            err.print("error: no tokens file: pass --file PATH or set serve.tokens_file")
            raise typer.Exit(2)
        path = file or Path(configured).expanduser()
        secret = add_token(path, user)
    if as_json:
        print_json({"user": user, "token": secret, "file": str(path)})
        return
    out.print(secret)
    err.print(
        f"{user}'s token, shown this once (its hash is in {path}); a client sends it as "
        "Authorization: Bearer <token>"
    )
