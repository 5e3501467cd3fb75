"""`subscriptions/listen` (spec 2026-07-28, Subscriptions): long-lived SSE streams that carry
the change notifications a modern client asked for, each tagged with its subscription id.

A listener watches one upstream connection for broadcasts (list changes, resource updates)
and keeps the resource subscriptions it asked for held upstream, counted with everyone
else's. Listeners are bounded per principal (auth context) and in all; at either bound the
newcomer is refused (429), and no listener of another principal is ended for it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.downstream import sse
from gateway.downstream.envelope import Caller
from gateway.protocol import jsonrpc, mcp
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.dialects import extension
from gateway.tasks.engine import TaskEngine
from gateway.tasks.model import Task
from gateway.upstream.connection import Connection
from gateway.upstream.correlator import Host
from gateway.upstream.isolation import Route

# filter field -> (the notification it selects, the upstream capability that makes it real)
LIST_FILTERS = {
    "toolsListChanged": ("notifications/tools/list_changed", ("tools", "listChanged")),
    "promptsListChanged": ("notifications/prompts/list_changed", ("prompts", "listChanged")),
    "resourcesListChanged": ("notifications/resources/list_changed",
                             ("resources", "listChanged")),
}


class Listener:
    """One listen stream: a broadcast-only `Owner` of its connection."""

    capabilities: dict[str, Any] = {}  # it asks nothing of the server
    level: str | None = None
    modern = True

    def __init__(self, sub_id: RequestId, methods: set[str], uris: set[str], principal: str,
                 task_ids: list[str]) -> None:
        self.key = f"listen-{id(self)}"
        self.sub_id = sub_id
        self.methods = methods
        self.uris = uris
        self.principal = principal
        self.task_ids = task_ids
        self.stream = sse.Stream("0", 0)

    def task_changed(self, task: Task) -> None:
        """spec (tasks extension): each notification carries the full detailed task."""
        self.stream.push(jsonrpc.dumps(self.tagged(extension.NOTIFICATION,
                                                   extension.detailed(task))))

    def accepts(self, method: str) -> bool:
        return False

    def expect_reply(self, asked_id: str, host: Host) -> None:
        pass

    def is_subscribed(self, uri: str) -> bool:
        return uri in self.uris

    def deliver(self, msg: Message) -> None:
        method = msg.get("method")
        raw = msg.get("params")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if method not in self.methods and not (
                method == mcp.RESOURCE_UPDATED and params.get("uri") in self.uris):
            return  # spec: MUST NOT send types the client has not requested
        self.stream.push(jsonrpc.dumps(self.tagged(method, params)))

    def tagged(self, method: str, params: dict[str, Any]) -> Message:
        meta = {**(params.get("_meta") or {}), mcp.META_SUBSCRIPTION: self.sub_id}
        return jsonrpc.notification(method, {**params, "_meta": meta})

    def end(self) -> None:
        """Graceful closure: a complete result for the listen request, then the end."""
        self.stream.push(jsonrpc.dumps(jsonrpc.result(self.sub_id, {
            "resultType": "complete", "_meta": {mcp.META_SUBSCRIPTION: self.sub_id}})),
            last=True)


class Listeners:
    def __init__(self, max_per_owner: int, flow: sse.Flow, max_listeners: int | None = None
                 ) -> None:
        self.max_per_owner = max_per_owner
        self.max_listeners = max_listeners or max_per_owner
        self.flow = flow
        self.per_owner: Counter[str] = Counter()  # streams held or being opened
        self.live: set[Listener] = set()
        self.spare = self.max_listeners // 4  # places kept for principals holding none

    async def listen(self, request: web.Request, msg: Message, caller: Caller,
                     route: Route, engine: TaskEngine) -> web.StreamResponse:
        wanted = (msg.get("params") or {}).get("notifications") or {}
        if not isinstance(wanted, dict):
            raise errors.InvalidParams("Invalid params: notifications must be an object")
        principal = caller.principal
        self._reserve(principal)  # counted before anything awaits (issue 49)
        try:
            listener = await self._listener(msg, wanted, caller, route, engine)
            self._start(listener, route.conn)
            for task_id in listener.task_ids:
                engine.watch(task_id, listener.task_changed)
            try:
                resp = await sse.open_response(request, {})
                await sse.pump(request, resp, listener.stream, 0, self.flow)
            finally:
                for task_id in listener.task_ids:
                    engine.unwatch(task_id, listener.task_changed)
                self._stop(listener, route.conn)
        finally:
            self._given_back(principal)
        return resp

    def _reserve(self, principal: str) -> None:
        """A place for one more stream of `principal`, counted at once: no await comes
        between the check and the count, so concurrent requests cannot all pass the check
        (a shared store's round trip follows). The last quarter of the overall places is
        kept for principals holding none (docs/security.md: the principal over its share
        is refused first)."""
        mine = self.per_owner[principal]
        if mine >= self.max_per_owner:
            raise errors.TooManyListeners(
                f"Too many listen streams: at most {self.max_per_owner} per client")
        held = sum(self.per_owner.values())
        if held >= self.max_listeners or (mine and held >= self.max_listeners - self.spare):
            raise errors.TooManyListeners(
                f"Too many listen streams: the gateway holds its maximum of "
                f"{self.max_listeners}; retry later")
        self.per_owner[principal] += 1

    def _given_back(self, principal: str) -> None:
        self.per_owner[principal] -= 1
        if self.per_owner[principal] <= 0:
            del self.per_owner[principal]

    async def _listener(self, msg: Message, wanted: dict[str, Any], caller: Caller,
                        route: Route, engine: TaskEngine) -> Listener:
        """The stream asked for, its acknowledgment (spec: the first message, naming the
        subset honoured) pushed: what the server said it can tell when it was found ready
        (it may be lost since), and the asked tasks the caller owns."""
        honoured = _honoured(wanted, route.init_result.get("capabilities", {}))
        task_ids = await self._task_ids(wanted, caller, engine)
        if task_ids is not None:
            honoured["taskIds"] = task_ids
        listener = Listener(msg["id"], {LIST_FILTERS[k][0] for k in honoured if k in
                                        LIST_FILTERS},
                            set(honoured.get("resourceSubscriptions", [])), caller.principal,
                            task_ids or [])
        listener.stream.push(jsonrpc.dumps(listener.tagged(mcp.ACKNOWLEDGED,
                                                           {"notifications": honoured})))
        return listener

    @staticmethod
    async def _task_ids(wanted: dict[str, Any], caller: Caller, engine: TaskEngine
                  ) -> list[str] | None:
        """The asked task ids this caller owns (others are left out, as unknown ones)."""
        ids = wanted.get("taskIds")
        if ids is None:
            return None
        if not extension.declared(caller.capabilities):
            raise extension.missing()
        if not isinstance(ids, list):
            raise errors.InvalidParams("Invalid params: taskIds must be a list")
        owned = {t.id for t in await engine.owned(caller.principal, extension.NAME)}
        return [i for i in ids if isinstance(i, str) and i in owned]

    def _start(self, listener: Listener, conn: Connection) -> None:
        self.live.add(listener)
        conn.audience.watch(listener)
        for uri in listener.uris:
            if conn.hold(uri):
                conn.send_own(mcp.SUBSCRIBE, {"uri": uri})

    def _stop(self, listener: Listener, conn: Connection) -> None:
        self.live.discard(listener)
        conn.audience.unwatch(listener)
        for uri in listener.uris:
            if conn.release(uri):
                conn.send_own(mcp.UNSUBSCRIBE, {"uri": uri})

    def close(self) -> None:
        for listener in list(self.live):
            listener.end()


def _honoured(wanted: dict[str, Any], caps: dict[str, Any]) -> dict[str, Any]:
    """The part of a filter the upstream can serve (spec: unsupported types are omitted)."""
    honoured: dict[str, Any] = {}
    for field, (_, (cap, flag)) in LIST_FILTERS.items():
        if wanted.get(field) is True and (caps.get(cap) or {}).get(flag):
            honoured[field] = True
    uris = wanted.get("resourceSubscriptions")
    if isinstance(uris, list) and (caps.get("resources") or {}).get("subscribe"):
        honoured["resourceSubscriptions"] = [u for u in uris if isinstance(u, str)]
    return honoured
