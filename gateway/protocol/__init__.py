"""Pure protocol data: JSON-RPC envelope helpers, MCP names, versions and HTTP header names.

Nothing here does I/O; everything is importable from the engine, router and transports alike.
"""
