"""``team``: a shared server for a team — ``team token NAME`` gives a user a bearer token."""

from __future__ import annotations

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
)

team_app = typer.Typer(
    help="A shared server for a team: users and their tokens.", no_args_is_help=True
)


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
