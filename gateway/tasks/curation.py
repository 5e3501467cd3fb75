"""How clients see an upstream's tools (issue 53, docs/tools.md): the curation keys of the
tools' entries in `tasks.tools` (`expose`, `name`, `title`, `description`, `annotations`),
globally and per upstream, matched as task policies are (`matching`: every entry naming a
tool, key by key, exact name first, then globs in the order written; the upstream's over
the global ones).

Names: clients see and call a renamed tool by its new name; everything past the edge where
a call comes in (the router, task policies, queues, tasks, metrics, audit) knows the tool by
the server's own name, which is what the server gets. A call of a name no client may call
(a tool not exposed, the old name of a renamed tool) goes to the server `masked`, under a
name it cannot know, so it is answered exactly as an unknown tool is; the name is put back
in that answer (`unmask`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, TypeVar

from gateway.protocol import mcp
from gateway.settings.schema import ToolEntry

# Appended to a name no client may call: no server lists a tool with it (U+2060, the word
# joiner, is invisible and means nothing in a name).
MASK = "\u2060(not exposed)"


@dataclass(frozen=True, slots=True)
class Shown:
    """How one server tool is shown to clients: each field None where the server's holds."""

    expose: bool = True
    name: str | None = None
    title: str | None = None
    description: str | None = None
    annotations: Mapping[str, Any] | None = None


PLAIN = Shown()
E = TypeVar("E")


class Curation:
    """One upstream's curation, from its layers of entries (global first, then its own).
    `active` is False when no entry curates: callers test it and skip the rest."""

    def __init__(self, layers: Sequence[Mapping[str, ToolEntry]]) -> None:
        self._layers = tuple(layers)
        self.active = any(e.curates for layer in layers for e in layer.values())
        self._shown: dict[str, Shown] = {}  # server names from tools/list answers: bounded
        # Renames are on exact names only (settings refuse one on a glob).
        self.renamed: dict[str, str] = {}
        for layer in layers:
            self.renamed.update({key: e.name for key, e in layer.items()
                                 if e.name is not None and e.name != key})
        self.called = {new: old for old, new in self.renamed.items()}

    def shown(self, tool: str) -> Shown:
        """How the server's tool `tool` is shown."""
        found = self._shown.get(tool)
        if found is None:
            found = self._resolve(tool)
            if len(self._shown) < 4096:
                self._shown[tool] = found
        return found

    def _resolve(self, tool: str) -> Shown:
        given: dict[str, Any] = {}
        for layer in self._layers:
            for _, entry in reversed(matching(layer, tool)):
                given.update({k: getattr(entry, k) for k in Shown.__slots__
                              if getattr(entry, k) is not None})
        return Shown(**given) if given else PLAIN

    def server_name(self, called: str) -> str | None:
        """The server's name of the tool a client calls `called`; None when no client may
        call it by that name (not exposed, or a renamed tool's old name)."""
        server = self.called.get(called)
        if server is None:
            if called in self.renamed:
                return None
            server = called
        return server if self.shown(server).expose else None

    def client_name(self, tool: str) -> str:
        """The name clients know the server's tool `tool` by."""
        return self.renamed.get(tool, tool)

    def listed(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A tools/list answer as clients see it: tools not exposed left out, a tool whose
        name another is renamed to left out too (the name is the renamed one's), the rest
        shown as their entries say."""
        result = msg.get("result")
        if isinstance(result, dict) and isinstance(tools := result.get("tools"), list):
            result["tools"] = [shown for tool in tools
                               if (shown := self._listed_tool(tool)) is not None]
        return msg

    def _listed_tool(self, tool: Any) -> Any:
        if not isinstance(tool, dict):
            return tool
        name = str(tool.get("name", ""))
        how = self.shown(name)
        if not how.expose or (name in self.called and name not in self.renamed):
            return None
        if how is PLAIN:
            return tool
        out = {**tool, "name": self.client_name(name)}
        for key in ("title", "description"):
            if (value := getattr(how, key)) is not None:
                out[key] = value
        if how.annotations is not None:
            theirs = tool.get("annotations")
            out["annotations"] = {**(theirs if isinstance(theirs, dict) else {}),
                                  **how.annotations}
        return out

    def request(self, msg: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """A client's request as the server takes it (a tools/call of the server's name; a
        new message when changed), and the name called when it was masked."""
        params = msg.get("params")
        if msg.get("method") != mcp.TOOLS_CALL or not isinstance(params, dict):
            return msg, None
        taken, masked = self.called_as(params)
        return (msg if taken is params else {**msg, "params": taken}), masked

    def called_as(self, params: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """A tools/call's params as the server takes them (a new dict when changed), and the
        name the client called when it was masked (None otherwise)."""
        called = params.get("name")
        if not isinstance(called, str):
            return params, None
        server = self.server_name(called)
        if server is None:
            return {**params, "name": called + MASK}, called
        return (params if server == called else {**params, "name": server}), None


def unmask(value: Any, called: str) -> Any:
    """`value` (an answer to a masked call) with the masked name back to the one called,
    wherever the server repeated it."""
    if isinstance(value, str):
        return value.replace(called + MASK, called)
    if isinstance(value, dict):
        return {k: unmask(v, called) for k, v in value.items()}
    if isinstance(value, list):
        return [unmask(v, called) for v in value]
    return value


def matching(tools: Mapping[str, E], tool: str) -> list[tuple[str, E]]:
    """Every entry of one layer that names `tool`, the strongest first: its exact name, then
    the globs in the order written. Each sets the keys it gives that no stronger one gave
    (a cascade): an entry that only re-describes a tool keeps the scopes a glob below it
    sets (issue 53: a description must not open a tool to every token)."""
    found = [(tool, tools[tool])] if tool in tools else []
    return found + [(p, e) for p, e in tools.items() if p != tool and fnmatchcase(tool, p)]


__all__ = ["MASK", "Curation", "Shown", "matching", "unmask"]
