"""Upstream MCP servers: the `Connection` interface with id rewriting and correlation
(`base`), stdio processes and their supervision (`stdio`), and isolation modes (`isolation`)."""
