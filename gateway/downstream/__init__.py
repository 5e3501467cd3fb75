"""The Streamable HTTP server side, carrying out the router's decisions: request checks
(`http`), the endpoint that picks the era (`endpoint`), the legacy era (`legacy`, `session`,
`core_tasks`), the modern era (`modern`, `envelope`, `mrtr`, `listen`), and what both share
(`exchange`, `sse`, `shapes`)."""
