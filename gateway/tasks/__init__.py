"""Tasks: the neutral task model (`model`), its bounded store (`store`), per-tool policy
(`policy`). The engine and the wire dialects build on these; nothing here knows HTTP or the
shape of a task on the wire."""
