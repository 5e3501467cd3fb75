"""Tasks: the neutral task record (`model`), the `TaskStore` protocol and its backends
(`store`), per-tool policy (`policy`), the engine that alone owns the task lifecycle
(`engine`), and the wire dialects (`dialects`). No HTTP here, and nothing of upstream/."""
