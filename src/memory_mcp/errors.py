"""Every error the engine raises on purpose.

The adapters (CLI, MCP server) translate these at the edge: the CLI prints the
message and exits with ``exit_code``; the server answers with a tool error.
Anything else escaping the engine is a bug.

    MemoryMcpError
    ├── ConfigError            a setting or config file is invalid
    ├── InvalidInput           a caller passed a bad argument (what to change is in the message)
    │   └── SecretRejected     content holds a secret and the policy is "reject"
    ├── NotFound               no record with that id
    ├── StorageError           the database cannot be opened, migrated or written
    │   └── SchemaTooNew       the database was migrated by a newer memory-mcp
    └── EmbedderError          the embedding backend failed or is unavailable
        └── ModelNotLocal      the model is not on disk yet (a download may fetch it)
"""

from __future__ import annotations


class MemoryMcpError(Exception):
    """Base of every deliberate engine error."""

    exit_code = 1


class ConfigError(MemoryMcpError):
    """A setting or a config file is invalid."""

    exit_code = 78  # EX_CONFIG


class InvalidInput(MemoryMcpError):
    """A caller passed a bad argument; the message says what to change."""

    exit_code = 65  # EX_DATAERR


class SecretRejected(InvalidInput):
    """The content holds a secret and the secret policy is ``reject``."""


class NotFound(MemoryMcpError):
    """No record has the given id."""

    exit_code = 66  # EX_NOINPUT


class StorageError(MemoryMcpError):
    """The database cannot be opened, migrated or written."""

    exit_code = 74  # EX_IOERR


class SchemaTooNew(StorageError):
    """The database holds migrations this version does not know."""


class EmbedderError(MemoryMcpError):
    """The embedding backend failed or is not available."""

    exit_code = 69  # EX_UNAVAILABLE


class ModelNotLocal(EmbedderError):
    """The model is neither in the configured folder nor in the cache.

    ``hint`` says how to provide it (shown once, after every reason).
    """

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint
