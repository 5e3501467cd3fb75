"""Upstream MCP servers: a `Connection` (`connection`) is a transport (`transport`: `stdio`,
`http`) under a pure correlator (`correlator`) that speaks a legacy or a modern-only wire
(`wire`); following a server's own tasks (`native_tasks`), what its tools/list said
(`catalogue`), and which process serves whom (`isolation`). Imports nothing from tasks/ or
downstream/."""
