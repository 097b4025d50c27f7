"""The MCP adapter: the tools (``tools``), the transports that serve them
(``transports``) and the stdio front that answers the handshake (``front``).

Nothing is imported here: the front must start on the standard library alone.
"""
