"""``memory-mcp ui``: a local web viewer to see and curate the memory (``app``), behind
the same transport security as ``serve`` plus CSRF protection and a strict
Content-Security-Policy (``guard``)."""
