"""A team's database: the members' group role, its grants, and each member's role.

The tables belong to whoever migrated them (``team init``, run by the
database's owner or administrator); row-level security (migration m005) is on
for everyone else. Members are roles in the group ``memory_mcp_users``: they
read and write rows (never the schema), each under the policies, so that what
one stores in the global scope or as private is theirs alone even to a
teammate who reads the tables directly.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from memory_mcp.errors import InvalidInput, StorageError

if TYPE_CHECKING:
    from psycopg.sql import Composed

    from memory_mcp.storage.postgres.store import PgStore
    from memory_mcp.storage.postgres.transaction import Transaction

GROUP = "memory_mcp_users"
# A role name: what ``team add-user`` accepts (quoted as an identifier all the same).
ROLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,62}")


async def prepare(store: PgStore, embedder: str | None, dim: int | None) -> list[str]:
    """Make the group role and give it the rows of the store's schema (its tables now
    and those later migrations add); make the space of ``embedder`` now, and build
    every vector index that is due (members may not build indexes). What was done."""
    from psycopg import sql

    schema = sql.Identifier(store.schema)
    group = sql.Identifier(GROUP)
    done: list[str] = []
    async with store.write() as tx:
        if not await _role_exists(tx, GROUP):
            await _as_admin(tx, sql.SQL("CREATE ROLE {} NOLOGIN").format(group), "create roles")
            done.append(f"made the group role {GROUP}")
        for statement in (
            "GRANT USAGE ON SCHEMA {schema} TO {group}",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {group}",
            "REVOKE INSERT, UPDATE, DELETE ON {schema}.schema_migrations FROM {group}",
            "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {group}",
            "ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} "
            "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {group}",
            "ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} "
            "GRANT USAGE, SELECT ON SEQUENCES TO {group}",
        ):
            query = sql.SQL(statement).format(schema=schema, group=group)
            await _as_admin(tx, query, "grant on this schema (it is not its owner)")
        done.append(f"let {GROUP} read and write the rows of schema {store.schema}")
        if embedder is not None and dim is not None:
            known = await store.space(tx, embedder, dim=dim)
            if known is not None:
                done.append(f"vector space {known[0]} for {embedder} ({dim})")
        for made in await store.ensure_indexes(tx, grown=True):
            done.append(f"built the vector index {made}")
    return done


async def add_member(store: PgStore, name: str, password: str | None) -> str:
    """Make ``name`` a member: a login role in the group (made, with ``password`` if
    given, when missing). Which: "created" or "joined"."""
    from psycopg import sql

    if not ROLE_NAME.fullmatch(name):
        raise InvalidInput(
            f"user name {name!r} must start with a letter or _ and hold only letters, "
            "digits, _ . - (at most 63)"
        )
    role = sql.Identifier(name)
    async with store.write() as tx:
        if not await _role_exists(tx, GROUP):
            raise InvalidInput(
                f"{store.location} is not prepared for a team: run `memory-mcp team init` first"
            )
        exists = await _role_exists(tx, name)
        if not exists:
            made = sql.SQL("CREATE ROLE {} LOGIN").format(role)
            if password:
                made = sql.SQL("{} PASSWORD {}").format(made, sql.Literal(password))
            await _as_admin(tx, made, "create roles")
        join = sql.SQL("GRANT {} TO {}").format(sql.Identifier(GROUP), role)
        await _as_admin(tx, join, f"add members to {GROUP}")
    return "joined" if exists else "created"


async def _role_exists(tx: Transaction, name: str) -> bool:
    return bool(await tx.fetch("SELECT 1 FROM pg_roles WHERE rolname = %s", [name]))


async def _as_admin(tx: Transaction, query: Composed, what: str) -> None:
    """Run a statement only an administrator may; say so plainly when this role may not."""
    from psycopg import errors

    conn = tx.connection
    try:
        async with conn.transaction():
            await conn.execute(query)
    except errors.InsufficientPrivilege as exc:
        raise StorageError(
            f"this database role may not {what}: {exc}. Run it as the database's owner "
            "or an administrator (a role with CREATEROLE)"
        ) from exc
