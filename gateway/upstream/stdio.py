"""A stdio MCP server as a supervised subprocess.

Framing is newline-delimited JSON read straight from the pipe into one buffer: no per-line
limit (asyncio's StreamReader.readline stops at 64 KiB, which several-MiB messages hit), only a
total bound, `limits.max_message_bytes`, past which the process is restarted rather than let
it grow the gateway's memory. stderr lines are logged under the upstream's name.

The supervisor spawns, initializes (the legacy handshake at the newest version the server
accepts, declaring elicitation, sampling and roots so it may ask), then waits for the process
to exit; an exit fails every call in flight at once and restarts with capped exponential
backoff. Shutdown follows the spec (lifecycle, stdio): close stdin, wait, SIGTERM, SIGKILL.
Each process leads its own process group so that `npx` and its children go together.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

from gateway.errors import UpstreamError
from gateway.observability import log, metrics
from gateway.protocol.jsonrpc import Message
from gateway.settings import Upstream as UpstreamConf
from gateway.upstream.base import Call, Connection

STABLE_AFTER_S = 10.0  # a process that lived this long resets the backoff


class _Pipes(asyncio.SubprocessProtocol):
    """Splits stdout into lines for the connection and logs stderr lines."""

    def __init__(self, conn: StdioUpstream, max_bytes: int) -> None:
        self.conn = conn
        self.max_bytes = max_bytes
        self.out = bytearray()
        self.err = bytearray()
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._stdout(data)
        else:
            self._stderr(data)

    def _stdout(self, data: bytes) -> None:
        buf = self.out
        if not buf and data.endswith(b"\n") and data.count(b"\n") == 1:
            self.conn._on_line(data)  # the common case: exactly one whole message
            return
        start = len(buf)
        buf += data
        pos = 0
        with memoryview(buf) as view:  # orjson parses views: no copy of each line
            while (nl := buf.find(b"\n", start)) >= 0:
                if nl > pos:
                    self.conn._on_line(view[pos:nl])
                pos = start = nl + 1
        if pos == len(buf):
            self.out = bytearray()  # drop the capacity a big message left behind
        else:
            del buf[:pos]
        if len(self.out) > self.max_bytes:
            log.error("upstream.message_too_large", upstream=self.conn.name, bytes=len(buf))
            self.out = bytearray()
            self.conn._kill()

    def _stderr(self, data: bytes) -> None:
        self.err += data
        *lines, rest = self.err.split(b"\n")
        self.err = bytearray(rest[-65536:])
        for line in lines:
            if line.strip():
                log.info("upstream.stderr", upstream=self.conn.name,
                         line=line.decode("utf-8", "replace")[:4000])

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class StdioUpstream(Connection):
    """One stdio server process, supervised: restarted when it exits (if `restart`)."""

    def __init__(self, name: str, conf: UpstreamConf, max_message_bytes: int,
                 restart: bool = True) -> None:
        super().__init__(name, conf.startup_timeout_ms / 1000)
        self.conf = conf
        self.max_message_bytes = max_message_bytes
        self.restart = restart
        self._transport: asyncio.SubprocessTransport | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._pipes: _Pipes | None = None
        self._outbox: list[bytes] = []
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"upstream:{self.name}")

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop_process()
        self.fail_all(UpstreamError(self.name, "the gateway is shutting down", "shutdown"))

    async def _supervise(self) -> None:
        failures = 0
        while not self._closing:
            began = time.monotonic()
            try:
                await self._spawn()
                await self._initialize()
            except (OSError, UpstreamError) as exc:
                log.error("upstream.start_failed", upstream=self.name, error=str(exc))
                await self._stop_process()
            else:
                code = await self._wait_exit()
                self._on_exit(code)
            if not self.restart or self._closing:
                self.state = "stopped"
                return
            failures = 0 if time.monotonic() - began > STABLE_AFTER_S else failures + 1
            delay = min(self.conf.restart_backoff_max_ms / 1000, 0.1 * 2 ** max(failures - 1, 0))
            self.state = "backoff"
            log.info("upstream.restarting", upstream=self.name, delay_s=round(delay, 3))
            await asyncio.sleep(delay)
            self.restarts += 1

    async def _spawn(self) -> None:
        self.state = "starting"
        loop = asyncio.get_running_loop()
        env = {**os.environ, **self.conf.env} if self.conf.env else None
        pipes = _Pipes(self, self.max_message_bytes)
        assert self.conf.command is not None
        transport, _ = await loop.subprocess_exec(
            lambda: pipes, self.conf.command, *self.conf.args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=self.conf.cwd, start_new_session=True)
        self._transport, self._pipes = transport, pipes
        self._stdin = transport.get_pipe_transport(0)  # type: ignore[assignment]
        log.info("upstream.spawned", upstream=self.name, pid=transport.get_pid(),
                 command=self.conf.command)

    async def _initialize(self) -> None:
        await self._handshake(self._answer)

    async def _answer(self, reply: asyncio.Future[Message]) -> Message:
        """The server's answer to a handshake request, unless it exits or stays silent."""
        assert self._pipes is not None
        exited = self._pipes.exited
        done, _ = await asyncio.wait({reply, exited}, timeout=self.startup_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if reply not in done:
            why = "exited during initialize" if exited in done else "did not answer initialize"
            raise UpstreamError(self.name, f"upstream '{self.name}' {why}", "initialize")
        return reply.result()

    async def _wait_exit(self) -> int | None:
        assert self._pipes is not None
        assert self._transport is not None
        # Shielded: cancelling the supervisor must not cancel the future shutdown waits on.
        await asyncio.shield(self._pipes.exited)
        code = self._transport.get_returncode()
        _signal_group(self._transport.get_pid(), signal.SIGKILL)  # whatever it left behind
        self._transport.close()
        self._transport = None
        return code

    def _on_exit(self, code: int | None) -> None:
        self.init_result = None
        self._ready.clear()
        self.state = "exited"
        self._stdin = None
        metrics["upstream.exits"] += 1
        log.warning("upstream.exited", upstream=self.name, code=code, in_flight=self.in_flight)
        self.fail_all(UpstreamError(
            self.name, f"upstream '{self.name}' exited (code {code}) before answering",
            "exited", exitCode=code))

    # -- transport -------------------------------------------------------------------------
    def _write(self, data: bytes, call: Call | None = None,
               headers: dict[str, str] | None = None) -> None:
        stdin = self._stdin
        if stdin is None or stdin.is_closing():
            raise UpstreamError(self.name, f"upstream '{self.name}' is not running", "down")
        if self.in_flight <= 1 and not self._outbox:
            stdin.writelines((data, b"\n"))  # nothing to batch with: no extra loop turn
            return
        # Under load, messages written in one event-loop turn leave in one write: a syscall
        # (and a wake-up of the server) per turn rather than per message.
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox += (data, b"\n")

    def _flush(self) -> None:
        chunks, self._outbox = self._outbox, []
        stdin = self._stdin
        if stdin is not None and not stdin.is_closing():
            stdin.writelines(chunks)

    def _kill(self) -> None:
        if self._transport is not None:
            _signal_group(self._transport.get_pid(), signal.SIGKILL)

    async def _stop_process(self) -> None:
        """spec (lifecycle, stdio shutdown): close stdin, wait, then SIGTERM, then SIGKILL."""
        transport, pipes = self._transport, self._pipes
        if transport is None or pipes is None:
            return
        self._stdin = None
        pid = transport.get_pid()
        with contextlib.suppress(Exception):
            transport.get_pipe_transport(0).close()  # type: ignore[union-attr]
        for sig, wait_s in ((None, self.conf.shutdown_grace_ms / 1000), (signal.SIGTERM, 2.0),
                            (signal.SIGKILL, 2.0)):
            if sig is not None:
                _signal_group(pid, sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pipes.exited), wait_s)
            if pipes.exited.done():
                break
        # The leader is gone; make sure nothing it started lingers in its group.
        _signal_group(pid, signal.SIGKILL)
        transport.close()
        self._transport = None


def _signal_group(pid: int | None, sig: int) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
