"""One message's POST to a Streamable HTTP server, and the session state every POST carries.

spec: mcp-base-2025-06-18.md, Streamable HTTP. Each message is its own POST, answered with
JSON, an SSE stream (what comes on it belongs to the POST's call), or 202. Failures: a POST
that cannot connect is tried again (nothing was sent); one whose connection drops after
sending is tried again only for read-only methods; otherwise its call fails at once with a
JSON-RPC error. An SSE answer that ends (or drops) before the answer is resumed by GET with
`Last-Event-ID` when the server gave event ids, after its `retry`, while resumes bring
something new (resumption.py resumes it; the bounds: sse_client.py); a server that gave
none fails the call at once. What the POST keeps of that job is its call's failure and its
session's loss (`Poster._resume`).
A 404 to a POST that carried the session id means the server forgot the session: the
session is lost (the transport starts another) and the request goes once more on the new
one. A POST unanswered when the session is lost otherwise (its GET stream told first) waits
for its answer: a 404 sends it again, anything else fails it with the session (`doubt`).

An answer is counted in the gateway's answer budget as it is read, under its call's
principal (answer_bytes.py, `Partial`): past that principal's share the reading stops and the
call fails with AnswersOverBudget, as a whole answer would; the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from gateway import redact
from gateway.answer_bytes import UNCOUNTED, Partial
from gateway.errors import (
    AnswersOverBudget,
    UpstreamConnectionFailed,
    UpstreamError,
    UpstreamSessionLost,
    UpstreamTooLarge,
)
from gateway.observability import log
from gateway.protocol import jsonrpc, mcp
from gateway.settings.schema import Upstream as UpstreamConf
from gateway.upstream import sse_client
from gateway.upstream.correlator import Call
from gateway.upstream.resumption import Resumption
from gateway.upstream.sse_client import EventReader, TooLarge
from gateway.upstream.transport import Link

CONNECT_ATTEMPTS = 3  # a POST that could not connect sent nothing: safe to try again
SESSION_WORDS = 4096  # bytes of a 400's body looked at for a word of the session
# Requests that change nothing on the server: sent again once when the connection drops
# after they went out (others could run twice).
IDEMPOTENT = frozenset({mcp.PING, "tools/list", "prompts/list", "prompts/get",
                        "resources/list", "resources/templates/list", "resources/read",
                        "completion/complete"})


@dataclass(slots=True)
class ServerSession:
    """What the transport knows of its session with the server, as every request shows it."""

    url: str
    base_headers: dict[str, str]
    post_url: str = ""  # the HTTP+SSE transport names its own
    session_id: str | None = None  # a modern server is stateless: it gives none
    version: str | None = None  # what the handshake settled on
    kind: str = "streamable-http"
    state: str = "starting"
    refused: int | None = None  # HTTP status of a refused initialize POST
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    def begin(self) -> None:
        """A new session: nothing known until the handshake says it."""
        self.session_id, self.post_url, self.refused = None, self.url, None
        self.kind, self.version, self.state = "streamable-http", None, "initializing"
        self.lost.clear()

    def headers(self) -> dict[str, str]:
        headers = {**self.base_headers, "Content-Type": mcp.CT_JSON,
                   "Accept": f"{mcp.CT_JSON}, {mcp.CT_SSE}"}
        if self.version is not None:  # spec: MCP-Protocol-Version on subsequent requests
            headers[mcp.H_PROTOCOL] = self.version
        if self.session_id is not None:
            headers[mcp.H_SESSION] = self.session_id
        return headers


class Poster:
    """Delivers messages by POST and hands what comes back to the link."""

    def __init__(self, name: str, conf: UpstreamConf, session: ServerSession, link: Link,
                 http: aiohttp.ClientSession, write: Callable[[bytes], None],
                 max_bytes: int, partial: Callable[[str | None], Partial] | None = None,
                 resends: bool = True) -> None:
        self.name, self.conf, self.session, self.link, self.http = name, conf, session, link, http
        self.max_bytes = max_bytes  # limits.max_message_bytes: of one answer, as of a line
        # How an answer read in part is counted in the answer budget, by its call's
        # principal (None: the gateway's own request).
        self.partial = partial or (lambda _: UNCOUNTED)
        self.write = write  # for the cancel of a call that timed out
        connect = conf.connect_timeout_ms / 1000
        read = conf.read_timeout_ms / 1000 if conf.read_timeout_ms else None
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        self.resending: set[Call] = set()  # calls to send again on the next session
        self.resends = resends  # whether a next session begins (not on a per-call connection)
        # Calls whose POST carried the session id and has no answer yet (a 404 may come),
        # and those of them whose session was lost meanwhile (`doubt`).
        self.unanswered: set[Call] = set()
        self.doubtful: set[Call] = set()
        self.resumption = Resumption(name, link, http, session.url, session.headers,
                                     self.timeout)

    def doubt(self) -> set[Call]:
        """The session was lost: the calls whose POSTs are not answered yet, now doubtful.
        Each waits for its POST's answer: a 404 sends it again (`_again`: the server never
        saw it), anything else fails it (`_bounded`: the lost session's answer)."""
        self.doubtful |= self.unanswered
        return set(self.unanswered)

    async def post(self, data: bytes, call: Call | None, extra: dict[str, str] | None,
                   again: bool = True) -> None:
        headers = {**extra, **self.session.headers()} if extra else self.session.headers()
        carried = headers.get(mcp.H_SESSION)
        if call is not None and carried is not None:
            self.unanswered.add(call)
        try:
            await self._post(data, call, extra, again, headers, carried)
        finally:
            if call is not None:
                self.unanswered.discard(call)

    async def _post(self, data: bytes, call: Call | None, extra: dict[str, str] | None,
                    again: bool, headers: dict[str, str], carried: str | None) -> None:
        unreached = False
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                # No redirect is followed: the upstream's headers (its credentials) go to
                # the configured origin only.
                async with self.http.post(self.session.post_url, data=data, headers=headers,
                                          timeout=self.timeout, allow_redirects=False) as resp:
                    gone = await self._bounded(resp, data, call, carried)
                if gone is not None:
                    await self._again(data, call, extra, gone, again)
                return
            except aiohttp.ClientConnectorError as exc:  # nothing was sent
                why, unreached = f"cannot be reached: {reason(exc)}", attempt == CONNECT_ATTEMPTS
                await asyncio.sleep(0.1 * attempt)
            except aiohttp.ConnectionTimeoutError:  # no connection: nothing was sent either
                # One attempt: each waits connect_timeout_ms, more would hold the caller. The
                # session stays: a full accept queue fails this call, not the calls of
                # others whose streams still flow.
                why = ("cannot be reached: no connection within connect_timeout_ms "
                       f"({self.conf.connect_timeout_ms})")
                break
            except TimeoutError:
                why = f"sent no reply within read_timeout_ms ({self.conf.read_timeout_ms})"
                if call is not None and self.link.pending(call):
                    with contextlib.suppress(UpstreamError):
                        self.write(jsonrpc.line(jsonrpc.notification(mcp.CANCELLED, {
                            "requestId": call.upstream_id, "reason": why})))
                break
            except aiohttp.ClientError as exc:
                why = f"dropped the connection: {reason(exc)}"
                if attempt > 1 or _method(data) not in IDEMPOTENT:
                    break
        self.failed(data, call, why)
        if unreached:
            self.unreachable(why)

    def unreachable(self, why: str) -> None:
        """The server cannot be reached at all (a POST's every attempt failed to connect):
        whatever session it held is gone with it; the transport starts again (with backoff,
        not ready meanwhile: /readyz says so) rather than fail every call one by one."""
        if self.session.state == "up":
            log.warning("upstream.unreachable", upstream=self.name, reason=why,
                        url=redact.url(self.session.post_url))
            self.session.lost.set()

    async def _again(self, data: bytes, call: Call | None, extra: dict[str, str] | None,
                     carried: str, again: bool) -> None:
        """spec (Session Management): a 404 to a request that carried the session id means
        the server forgot the session and did not process the request (so does a 400 that
        says the session id is not valid: see `forgets_session`): the transport starts a new
        session, and the request goes once more (its call kept meanwhile)."""
        if self.session.session_id == carried:
            self.session.lost.set()
        if call is not None:
            self.doubtful.discard(call)  # the server never saw it: sent again
        if call is None or not again:
            self.failed(data, call, "lost the session again")
            return
        # No session follows a per-call connection: nothing to wait for. A server's task ids
        # are its session's: on the next, the id of a task of this one may name another's.
        if not self.resends or call.task_of is not None:
            self.link.on_failed(call, session_lost(self.name))
            return
        self.resending.add(call)
        try:
            await _until(lambda: self.session.state == "up"
                         and self.session.session_id != carried,
                         self.conf.startup_timeout_ms / 1000)
        except TimeoutError:
            self.failed(data, call, "lost the session and no new one began in time")
            return
        finally:
            self.resending.discard(call)
        if self.link.pending(call):
            await self.post(data, call, extra, again=False)

    async def _bounded(self, resp: aiohttp.ClientResponse, data: bytes, call: Call | None,
                       carried: str | None) -> str | None:
        """The answer, read to at most max_message_bytes a message, and counted as it comes
        in its principal's answer bytes: past either the reading stops (the connection
        closes, the rest unread), and the call fails saying so; the session goes on (only
        this POST's connection is dropped). The session id the server forgot, when the
        request `carried` one and the answer says so (`forgets_session`): not read further,
        the request goes again."""
        part = self.partial(_principal(call))
        if call is not None:
            self.unanswered.discard(call)  # answered: a 404 (`_again`) or not
        try:
            said = await refusal(resp, self.max_bytes, part) if carried else None
            if carried is not None and forgets_session(resp.status, said or b""):
                return carried
            if self._of_lost_session(call):
                resp.close()
                return None
            await self._answered(resp, data, call, said, part)
        except TooLarge:
            resp.close()
            self.too_large(data, call)
        except AnswersOverBudget as exc:
            resp.close()
            self.over_budget(call, exc)
        finally:
            part.count(0)  # handed on, or dropped
        return None

    def _of_lost_session(self, call: Call | None) -> bool:
        """Whether the answer to `call`, begun now, belongs to a session lost since it was
        sent (not a 404: the server may have run it): the call fails as the session's other
        calls did, unread (what it says may name that session's tasks or requests)."""
        if call is None or call not in self.doubtful:
            return False
        self.doubtful.discard(call)
        self.link.on_failed(call, session_lost(self.name))
        return True

    async def _answered(self, resp: aiohttp.ClientResponse, data: bytes, call: Call | None,
                        said: bytes | None, part: Partial) -> None:
        sid = resp.headers.get(mcp.H_SESSION)
        if sid and self.session.session_id is None:
            self.session.session_id = sid
        if 300 <= resp.status < 400:
            self.failed(data, call, redirect_refused(self.name, resp))
        elif resp.status >= 400:
            if resp.status < 500 and self.session.state == "initializing":
                self.session.refused = resp.status
            if resp.content_type == mcp.CT_JSON:  # a JSON-RPC error, e.g. a modern server's
                body = said if said is not None else await read_body(resp, self.max_bytes, part)
                part.count(0)  # handed on whole
                if body:
                    self.link.on_message(body, call)
            self.failed(data, call, f"answered HTTP {resp.status}")
        elif resp.status == 202:  # spec (Sending Messages): accepted, no body (mcp 2.x
            pass  # servers still label it application/json, with a length of 0)
        elif resp.content_type == mcp.CT_SSE:  # a POST's stream: what comes on it is its call's
            reader = EventReader(self.max_bytes, part)
            try:
                await sse_client.read(reader, resp, self.link.on_message, call)
            except aiohttp.ClientError:
                if reader.last_id is None:
                    raise  # nothing to resume from: the POST failed (`post` says how)
            await self._resume(reader, call)
        elif resp.content_type == mcp.CT_JSON and not await json_body(
                resp, lambda msg: self.link.on_message(msg, call), self.max_bytes, part):
            self.failed(data, call, "answered what is not a JSON-RPC message (an "
                        "application/json body holds one)")
        # else the HTTP+SSE transport, whose answers come on its stream

    async def _resume(self, reader: EventReader, call: Call | None) -> None:
        """The POST's part in resuming its answer's stream (resumption.py resumes it): the
        call fails saying why it was given up, or that a resumed stream was past its bounds;
        a refused resume that says the server forgot the session loses the session."""
        if call is None:
            return
        try:
            gave_up = await self.resumption.resume(reader, call)
        except TooLarge:
            self.too_large(b"", call)
            return
        except AnswersOverBudget as exc:
            self.over_budget(call, exc)
            return
        if gave_up is None:
            return
        refusal = gave_up.refusal
        if refusal is not None and self.session.session_id is not None \
                and forgets_session(refusal.status, refusal.body):
            self.session.lost.set()
        self.failed(b"", call, gave_up.why)

    def too_large(self, data: bytes, call: Call | None) -> None:
        """The answer to `call` went past max_message_bytes: it fails alone, saying so."""
        if call is not None and self.link.on_failed(call, UpstreamTooLarge.over(
                self.name, self.max_bytes)):
            log.warning("upstream.message_too_large", upstream=self.name,
                        max_message_bytes=self.max_bytes,
                        method=_method(data) if data else None)

    def over_budget(self, call: Call | None, error: AnswersOverBudget) -> None:
        """The answer to `call`, read in part, took its principal past its share of the
        answer budget: it fails alone, with the error a whole answer would get (counted,
        as that refusal is, in mcp_gateway_rejections_total{reason="answer_bytes"}; not
        logged, as it is not)."""
        if call is not None:
            self.link.on_failed(call, error)

    def failed(self, data: bytes, call: Call | None, why: str) -> None:
        """A request that got no answer fails now, with a JSON-RPC error that says why
        (`why`: what the server did, as its clients may read it: never where it is, which
        the log line has)."""
        if call is None:
            return
        error = UpstreamConnectionFailed(self.name, f"upstream '{self.name}' {why}")
        if self.link.on_failed(call, error) and self.session.state == "up":  # else start_failed
            log.warning("upstream.request_failed", upstream=self.name, reason=why,
                        method=_method(data) if data else None,
                        url=redact.url(self.session.post_url))


async def refusal(resp: aiohttp.ClientResponse, max_bytes: int, part: Partial = UNCOUNTED
                  ) -> bytes | None:
    """The body of a 400, read (to see whether it says the session is unknown: see
    `forgets_session`) and, a JSON body, kept for the call's answer; None for any other
    status. A JSON body is counted as it is decompressed and read, as every answer is
    (`read_body`): a small gzip body that inflates past `max_bytes` is cut there and read
    as empty, never held whole; of any other body SESSION_WORDS bytes are read."""
    if resp.status != 400:
        return None
    try:
        if resp.content_type != mcp.CT_JSON:
            return await _start(resp, SESSION_WORDS)
        return await read_body(resp, max_bytes, part)
    except (TooLarge, aiohttp.ClientError, TimeoutError):
        part.count(0)  # dropped
        return b""


async def _start(resp: aiohttp.ClientResponse, size: int) -> bytes:
    """The first `size` bytes of the body (all of a shorter one)."""
    try:
        return await resp.content.readexactly(size)
    except asyncio.IncompleteReadError as exc:
        return exc.partial


def session_lost(name: str) -> UpstreamSessionLost:
    """What a call of a session the server ended is answered."""
    return UpstreamSessionLost(name, f"upstream '{name}' ended its session")


def forgets_session(status: int | None, body: bytes) -> bool:
    """spec (Session Management): a 404 to a request with a session id means the server
    ended the session. The TypeScript SDK's servers (its examples, server-everything)
    answer 400 "Bad Request: No valid session ID provided" instead, after a restart: a 400
    whose body speaks of the session is taken the same way."""
    return status == 404 or (status == 400 and b"session" in body[:SESSION_WORDS].lower())


async def json_body(resp: aiohttp.ClientResponse, deliver: Callable[[bytes], bool],
                    max_bytes: int, part: Partial = UNCOUNTED) -> bool:
    """An application/json answer, message by message to `deliver`; False when some part
    of it was no message (the caller ends the POST's call: it will hear nothing more);
    TooLarge, unread, when it says it is longer than `max_bytes`, or once a message has
    grown past it.

    spec (Sending Messages): the body is one JSON object, and it is read whole. One sent
    without a length (chunked) may go on for long, a message a line (seen from servers
    answering subscriptions/listen so): each is delivered as its line ends, not when the
    body ends. A body of several JSON lines is read as those messages either way. What is
    read and not yet delivered is counted in `part` (the answer budget: AnswersOverBudget)."""
    if resp.content_length is None:
        return await _json_lines(resp, deliver, max_bytes, part)
    body = await read_body(resp, max_bytes, part)
    part.count(0)  # handed on whole
    lines = _lines(body) if b"\n" in body.strip() else None  # compact JSON has no newline
    return all([deliver(m) for m in lines or [body]])


async def read_body(resp: aiohttp.ClientResponse, max_bytes: int,
                    part: Partial = UNCOUNTED) -> bytes:
    """The whole body, if it says it holds `max_bytes` at most (TooLarge, unread, if not);
    one without a length is read to the bound. Counted in `part` as it comes, and still
    when it is returned: whoever hands it on gives it back (`part.count(0)`)."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise TooLarge(max_bytes)
    body = bytearray()  # decompressed, it may be longer than it said: counted as it comes
    async for chunk in resp.content.iter_any():
        body += chunk
        if len(body) > max_bytes:
            raise TooLarge(max_bytes)
        part.count(len(body))
    return bytes(body)


async def _json_lines(resp: aiohttp.ClientResponse, deliver: Callable[[bytes], bool],
                      max_bytes: int, part: Partial = UNCOUNTED) -> bool:
    buffer, ok = bytearray(), True
    async for chunk in resp.content.iter_any():
        buffer += chunk
        if len(buffer) > max_bytes:  # the bound is a message's, as a stdio line's
            raise TooLarge(max_bytes)
        part.count(len(buffer))
        # A chunk that ends a line may end a message (a body pretty-printed over many lines
        # is one JSON document, whole only at its last line). Parsing is tried only when
        # that line begins at the margin with a bracket (a message a line, or a document's
        # closing one): a pretty-printed body is parsed once or twice, not at every line.
        if buffer.endswith(b"\n") and _at_margin(buffer) and \
                (messages := _messages(bytes(buffer))) is not None:
            part.count(0)  # handed on whole
            ok = all([deliver(m) for m in messages]) and ok
            buffer = bytearray()
    part.count(0)
    if rest := bytes(buffer).strip():
        ok = all([deliver(m) for m in _messages(rest) or [rest]]) and ok
    return ok


def _at_margin(buffer: bytearray) -> bool:
    """Whether the last whole line of `buffer` opens or closes a JSON value at its margin."""
    last = buffer.rfind(b"\n", 0, len(buffer) - 1) + 1
    return bytes(buffer[last:last + 1]) in (b"{", b"}", b"[", b"]")


def _messages(buffer: bytes) -> list[bytes] | None:
    """`buffer` as whole messages: one JSON document, or JSON lines; None when neither."""
    with contextlib.suppress(jsonrpc.JSONDecodeError):
        jsonrpc.loads(buffer)
        return [buffer]
    return _lines(buffer)


def _lines(body: bytes) -> list[bytes] | None:
    """The lines of `body`, when there are several and each is a JSON document."""
    lines = [line for line in body.split(b"\n") if line.strip()]
    if len(lines) < 2:
        return None
    try:
        for line in lines:
            jsonrpc.loads(line)
    except jsonrpc.JSONDecodeError:
        return None
    return lines


def redirect_refused(upstream: str, resp: aiohttp.ClientResponse) -> str:
    """Why a redirect was not followed, logged (`upstream.redirect_refused`) with where it
    pointed (its origin only); its clients are not told where (docs/security.md:
    no internal URL in a client's error)."""
    location = resp.headers.get("Location", "")
    target = URL(resp.url).join(URL(location)).origin() if location else None
    log.warning("upstream.redirect_refused", upstream=upstream, status=resp.status,
                to=str(target) if target else None)
    return (f"answered HTTP {resp.status}: the gateway follows no redirect (its headers for "
            "this upstream go to the configured URL only): configure the URL it points to "
            "(the gateway's log names it)")


def reason(exc: aiohttp.ClientError) -> str:
    """Why a request failed, as a client may read it: the OS's words, or what went wrong
    with the answer; never the host, port or URL it went to (aiohttp's own text names them,
    and its TLS context, "ssl:default", even for a plain http:// URL). Who logs it logs
    where (docs/security.md: no internal URL in a client's error)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _os_reason(exc.os_error)
    if isinstance(exc, aiohttp.ClientOSError) and exc.errno:  # e.g. reset by peer
        return _os_reason(exc)
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status}: {exc.message}" if exc.message else f"HTTP {exc.status}"
    return redact.no_urls(str(exc)) or type(exc).__name__


def _os_reason(error: OSError) -> str:
    """The OS's words for `error`, not its text: asyncio's names the address ("Connect call
    failed ('10.0.3.4', 8080)"), a certificate's the host it was not valid for."""
    if isinstance(error, ssl.SSLError):
        return f"TLS failed ({error.reason or type(error).__name__})"
    if error.errno is not None and error.errno > 0:
        return os.strerror(error.errno)
    # The resolver's (negative) codes: its own words, which name no address.
    return error.strerror if isinstance(error.strerror, str) else type(error).__name__


async def _until(holds: Callable[[], bool], timeout_s: float) -> None:
    """Wait until `holds()`, looking every 20 ms; TimeoutError after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not holds():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError
        await asyncio.sleep(0.02)


def _principal(call: Call | None) -> str | None:
    """Whose answer `call`'s is: its owner's principal; None for the gateway's own."""
    return call.owner.principal if call is not None and call.owner is not None else None


def _method(data: bytes) -> str | None:
    with contextlib.suppress(jsonrpc.JSONDecodeError):
        msg = jsonrpc.loads(data)
        method = msg.get("method") if isinstance(msg, dict) else None
        if isinstance(method, str):
            return method
    return None
