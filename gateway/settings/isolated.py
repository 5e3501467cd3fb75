"""load_isolated: the settings validated in a forked child and handed back pickled, so the
serving process never imports pydantic, PyYAML or the validating half of this package
(gateway/settings/__init__.py; bench/README: Memory).
"""

from __future__ import annotations

import os
import pickle
import signal
import typing
from collections.abc import Callable
from typing import Any

from gateway import redact
from gateway.settings import ConfigError
from gateway.settings.schema import Settings


def load_isolated(build: Callable[[], Settings]) -> Settings:
    """`build()` (which validates: `load.from_mapping`) run in a forked child, its Settings
    handed back pickled. Why: importing pydantic and building its validators keeps ~10 MiB
    resident for the life of a process (bench/README: Memory), and the serving process
    needs only the plain dataclasses. A ConfigError in the child is raised here with the
    same line. Where os.fork is missing, `build()` runs here. Called before any thread
    starts (a fork copies only the calling thread)."""
    if not hasattr(os, "fork"):
        return build()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: validate, answer, and leave without running the parent's exits
        os.close(read_end)
        _answer(write_end, build)
    os.close(write_end)
    answer = _read(read_end, pid)
    status = os.waitpid(pid, 0)[1]
    try:
        kind, value = pickle.loads(answer)
    except (pickle.UnpicklingError, EOFError, ValueError):  # killed, not a config error
        raise RuntimeError("validating the configuration failed: its process ended "
                           f"unanswered ({_ended(status)})") from None
    if kind == "error":
        raise ConfigError(value)
    if kind == "crash":
        raise RuntimeError(f"validating the configuration failed in its process:\n{value}")
    return typing.cast(Settings, value)


def _read(fd: int, pid: int) -> bytes:
    """The child's whole answer; interrupted (Ctrl-C, a signal), the child goes too."""
    try:
        with os.fdopen(fd, "rb") as pipe:
            return pipe.read()
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise


def _ended(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


def _answer(fd: int, build: Callable[[], Settings]) -> typing.NoReturn:
    code = 0
    try:
        reply: tuple[str, Any] = ("ok", build())
    except ConfigError as exc:
        reply = ("error", str(exc))
    except BaseException:  # a bug: its traceback goes to the parent
        import traceback

        # A validator's bug may quote a value (a store URL, its password): shown redacted.
        reply, code = ("crash", redact.text(traceback.format_exc())), 1
    try:
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(pickle.dumps(reply))
    finally:
        os._exit(code)
