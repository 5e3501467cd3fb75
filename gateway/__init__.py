"""MCP task gateway: a Streamable HTTP reverse proxy that gives every MCP server tasks."""

__version__ = "0.1.0"
