"""The stdio transport: an MCP server as a supervised subprocess.

Framing is newline-delimited JSON read straight from the pipe into one buffer: no per-line
limit (asyncio's StreamReader.readline stops at 64 KiB, which several-MiB messages hit), only a
total bound, `limits.max_message_bytes`, past which the process is restarted rather than let
it grow the gateway's memory; what a part-read line holds is counted in the gateway's budget
of answer bytes (answer_bytes.py `reading`). stderr lines are logged under the upstream's
name.

The supervisor spawns, lets its link run the handshake (abandoned if the process exits
meanwhile), then waits for the process to exit; an exit fails every call in flight at once
and restarts with capped exponential backoff. Shutdown follows the spec (lifecycle, stdio):
close stdin, wait, SIGTERM, SIGKILL. Each process leads its own process group so that `npx`
and its children go together.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.errors import (
    UpstreamDown,
    UpstreamError,
    UpstreamExited,
    UpstreamInitializeFailed,
    UpstreamStartFailed,
)
from gateway.observability import log
from gateway.settings.schema import Upstream as UpstreamConf
from gateway.upstream.correlator import Call
from gateway.upstream.transport import STABLE_AFTER_S, Link, backoff_s, start_failed

STDERR_TAIL, STDERR_LINE = 5, 300  # lines (and characters a line) told of a failed start
STDERR_WAIT_S = 0.5  # for the stderr pipe to close once the process exited


class _Pipes(asyncio.SubprocessProtocol):
    """Splits stdout into lines for the link and logs stderr lines."""

    def __init__(self, name: str,
                 on_line: Callable[[bytes | bytearray | memoryview], object],
                 kill: Callable[[], None], max_bytes: int,
                 reading: Callable[[int], None] | None = None) -> None:
        self.name = name
        self.on_line = on_line
        self.kill = kill
        self.max_bytes = max_bytes
        self.reading = reading or (lambda _: None)
        self.counted = 0  # of `out`, in the answer budget
        self.out = bytearray()
        self.err = bytearray()
        self.said: deque[str] = deque(maxlen=STDERR_TAIL)  # its last lines, for a failed start
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.err_closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            self._stdout(data)
        else:
            self._stderr(data)

    def _stdout(self, data: bytes) -> None:
        buf = self.out
        if not buf and data.endswith(b"\n") and data.count(b"\n") == 1:
            self.on_line(data)  # the common case: exactly one whole message
            return
        start = len(buf)
        buf += data
        if buf.find(b"\n", start) == len(buf) - 1:  # one whole message, read in parts
            self._hand_over(buf)
            return
        pos = 0
        with memoryview(buf) as view:  # orjson parses views: no copy of each line
            while (nl := buf.find(b"\n", start)) >= 0:
                if nl > pos:
                    self.on_line(view[pos:nl])
                pos = start = nl + 1
        if pos == len(buf):
            self.out = bytearray()  # drop the capacity a big message left behind
        else:
            del buf[:pos]
        if len(self.out) > self.max_bytes:
            log.error("upstream.message_too_large", upstream=self.name, bytes=len(buf))
            self.out = bytearray()
            self.kill()
        self._count(len(self.out))

    def _hand_over(self, buf: bytearray) -> None:
        """`buf` holds exactly one message (what `out` keeps never holds a newline): given
        to the link whole, which empties it once parsed (transport.Link.on_message), so a
        multi-MiB answer is not held as these bytes too while it is forwarded."""
        self.out = bytearray()
        del buf[-1]  # its newline
        self.on_line(buf)
        self._count(0)

    def _count(self, size: int) -> None:
        """The part-read line now holds `size` bytes: the budget hears the difference."""
        if size != self.counted:
            self.reading(size - self.counted)
            self.counted = size

    def _stderr(self, data: bytes) -> None:
        self.err += data
        *lines, rest = self.err.split(b"\n")
        self.err = bytearray(rest[-65536:])
        for line in lines:
            self._said(line)

    def _said(self, line: bytes | bytearray) -> None:
        if line.strip():
            text = line.decode("utf-8", "replace")
            log.info("upstream.stderr", upstream=self.name, line=text[:4000])
            self.said.append(text[:STDERR_LINE])

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:  # a line the server never ended goes with its process
            self.out = bytearray()
            self._count(0)
        if fd == 2:
            self._said(self.err)  # a last line without its newline
            self.err = bytearray()
            if not self.err_closed.done():
                self.err_closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


@dataclass(slots=True, eq=False)
class _Process:
    """One running server process: made whole when it is spawned."""

    transport: asyncio.SubprocessTransport
    pipes: _Pipes
    stdin: asyncio.WriteTransport | None  # None once closed (shutdown, or it exited)


class StdioTransport:
    """One stdio server process, supervised: restarted when it exits (if `restart`)."""

    kind = "stdio"

    def __init__(self, link: Link, name: str, conf: UpstreamConf, command: str,
                 max_message_bytes: int, restart: bool = True,
                 reading: Callable[[int], None] | None = None) -> None:
        self._link = link
        self.name = name
        self.state = "starting"
        self.restarts = 0
        self.conf = conf
        self.command = command
        self.max_message_bytes = max_message_bytes
        self.restart = restart
        self.reading = reading  # the answer budget's count of a part-read line
        self._proc: _Process | None = None  # while a process runs
        self._outbox: list[bytes] = []
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"upstream:{self.name}")

    def status(self) -> dict[str, Any]:
        return {"transport": self.kind}

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop_process()

    async def _supervise(self) -> None:
        failures = 0
        while not self._closing:
            began = time.monotonic()
            failed = await self._run_once()
            if not self.restart or self._closing:
                self.state = "stopped"
                if failed is not None:
                    self._link.on_down(failed)
                return
            failures = 0 if time.monotonic() - began > STABLE_AFTER_S else failures + 1
            self.state = "backoff"
            if failed is not None:
                await start_failed(self._link, failed, failures, self.conf.restart_backoff_max_ms)
            else:
                delay = backoff_s(failures, self.conf.restart_backoff_max_ms)
                log.info("upstream.restarting", upstream=self.name, delay_s=round(delay, 3))
                await asyncio.sleep(delay)
            self.restarts += 1

    async def _run_once(self) -> UpstreamError | None:
        """Start the process and run it until it exits; why it could not start, if so."""
        try:
            proc = self._proc = await self._spawn()
            await self._initialize(proc)
        except (OSError, UpstreamError) as exc:
            await self._stop_process()
            return exc if isinstance(exc, UpstreamError) else self._spawn_error(exc)
        self._on_exit(await self._wait_exit(proc))
        return None

    async def _spawn(self) -> _Process:
        self.state = "starting"
        loop = asyncio.get_running_loop()
        env = server_env(self.conf)
        pipes = _Pipes(self.name, self._link.on_message, self._kill, self.max_message_bytes,
                       self.reading)
        command = self.command
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: pipes, command, *self.conf.args,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, cwd=self.conf.cwd,
                start_new_session=True)
        except OSError as exc:
            raise self._spawn_error(exc) from None
        log.info("upstream.spawned", upstream=self.name, pid=transport.get_pid(),
                 command=command)
        return _Process(transport, pipes, transport.get_pipe_transport(0))  # type: ignore[arg-type]

    def _spawn_error(self, exc: OSError) -> UpstreamError:
        """What a user must fix, in words: the usual cause is a misspelt command."""
        command, where = self.command, f"upstream '{self.name}'"
        if isinstance(exc, FileNotFoundError) and exc.filename in (command, None):
            text = (f"{where}: command '{command}' was not found (is it installed and on "
                    "the gateway's PATH?)")
        elif isinstance(exc, FileNotFoundError):
            text = f"{where}: the working directory '{exc.filename}' does not exist"
        elif isinstance(exc, PermissionError):
            text = f"{where}: command '{command}' is not executable"
        else:
            text = f"{where}: command '{command}' could not start: {exc.strerror or exc}"
        return UpstreamStartFailed(self.name, text, command=command)

    async def _initialize(self, proc: _Process) -> None:
        """The link's handshake, unless the process exits first."""
        self.state = "initializing"
        up = asyncio.ensure_future(self._link.on_up())
        exited = proc.pipes.exited
        both: set[asyncio.Future[Any]] = {up, exited}
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the gateway stops: the handshake goes too, quietly
            up.cancel()
            up.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise
        if up.done():
            up.result()  # UpstreamError when the handshake failed
            self.state = "up"
            return
        up.cancel()
        with contextlib.suppress(asyncio.CancelledError, UpstreamError):
            await up
        raise await self._exited_early(proc)

    async def _exited_early(self, proc: _Process) -> UpstreamError:
        """The process exited before its handshake: its exit code and its last words on
        stderr (what its user must fix: a missing key, a bad argument) say why."""
        with contextlib.suppress(TimeoutError):  # the pipe may close after the exit
            await asyncio.wait_for(asyncio.shield(proc.pipes.err_closed), STDERR_WAIT_S)
        code, said = proc.transport.get_returncode(), list(proc.pipes.said)
        # Its stderr may hold what must not leave the gateway (a password it printed): the
        # operator reads it in the log; clients get the exit code.
        return UpstreamInitializeFailed(self.name, f"upstream '{self.name}' exited during "
                                        f"initialize (code {code}); see the gateway's log",
                                        detail=" | ".join(said), exitCode=code)

    async def _wait_exit(self, proc: _Process) -> int | None:
        # Shielded: cancelling the supervisor must not cancel the future shutdown waits on.
        await asyncio.shield(proc.pipes.exited)
        code = proc.transport.get_returncode()
        _signal_group(proc.transport.get_pid(), signal.SIGKILL)  # whatever it left behind
        proc.transport.close()
        self._proc = None
        return code

    def _on_exit(self, code: int | None) -> None:
        self.state = "exited"
        log.warning("upstream.exited", upstream=self.name, code=code,
                    in_flight=self._link.in_flight)
        self._link.on_lost(UpstreamExited(
            self.name, f"upstream '{self.name}' exited (code {code}) before answering",
            exitCode=code))

    # -- transport -------------------------------------------------------------------------
    def write(self, data: bytes, call: Call | None = None,
              headers: dict[str, str] | None = None) -> None:
        stdin = self._proc.stdin if self._proc is not None else None
        if stdin is None or stdin.is_closing():
            raise UpstreamDown(self.name, f"upstream '{self.name}' is not running")
        if self._link.in_flight <= 1 and not self._outbox:
            stdin.write(data)  # a whole line; nothing to batch with: no extra loop turn
            return
        # Under load, messages written in one event-loop turn leave in one write: a syscall
        # (and a wake-up of the server) per turn rather than per message.
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(data)

    def _flush(self) -> None:
        chunks, self._outbox = self._outbox, []
        stdin = self._proc.stdin if self._proc is not None else None
        if stdin is not None and not stdin.is_closing():
            stdin.writelines(chunks)

    def abort(self, call: Call) -> bool:
        return False  # a pipe has no stream per call

    def _kill(self) -> None:
        if self._proc is not None:
            _signal_group(self._proc.transport.get_pid(), signal.SIGKILL)

    async def _stop_process(self) -> None:
        """spec (lifecycle, stdio shutdown): close stdin, wait, then SIGTERM, then SIGKILL."""
        proc = self._proc
        if proc is None:
            return
        transport, pipes = proc.transport, proc.pipes
        proc.stdin = None
        pid = transport.get_pid()
        with contextlib.suppress(Exception):
            transport.get_pipe_transport(0).close()  # type: ignore[union-attr]
        try:
            for sig, wait_s in ((None, self.conf.shutdown_grace_ms / 1000),
                                (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
                if sig is not None:
                    _signal_group(pid, sig)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(pipes.exited), wait_s)
                if pipes.exited.done():
                    break
        finally:  # also when the stop is cancelled in its wait: nothing is left behind
            # The leader is gone (or goes now); nothing it started lingers in its group.
            _signal_group(pid, signal.SIGKILL)
            if not pipes.exited.done():  # reaped before its transport goes (else a zombie,
                # and a process object that outlives the loop that would have reaped it)
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(pipes.exited), 2.0)
            transport.close()
            self._proc = None


# What a stdio server starts with of the gateway's environment, which holds the gateway's
# secrets (tokens, the replica secret, the store's URL with its password): the variables the
# MCP SDKs pass by default on POSIX (HOME, LOGNAME, PATH, SHELL, TERM, USER), and what Node
# and Python servers need to run and to fetch packages over TLS (locale, time zone, temp
# folder, CA bundles). Nothing else unless the configuration names it (`inherit_env`, `env`).
DEFAULT_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL",
               "LC_CTYPE", "TZ", "TMPDIR", "SSL_CERT_FILE", "SSL_CERT_DIR",
               "NODE_EXTRA_CA_CERTS")


def server_env(conf: UpstreamConf) -> dict[str, str]:
    """The environment of a stdio server: the short default, the variables `inherit_env`
    names, then `env` (which wins)."""
    names = (*DEFAULT_ENV, *conf.inherit_env)
    return {**{n: os.environ[n] for n in names if n in os.environ}, **conf.env}


def _signal_group(pid: int | None, sig: int) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
