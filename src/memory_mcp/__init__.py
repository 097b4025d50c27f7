"""memory-mcp: one project brain shared by every coding agent."""

__version__ = "0.1.0.dev0"
