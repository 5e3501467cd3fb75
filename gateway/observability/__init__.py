"""Structured logging (structlog, configured once); owners as short hashes.

Event names are stable (`upstream.exited`, `session.created`, ...): dashboards and tests key on
them. Secrets never reach a log line: headers are never logged, and owners appear as hashes.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys

import orjson
import structlog

from gateway.settings.schema import Logging


def configure_logging(conf: Logging) -> None:
    level = logging.getLevelNamesMapping()[conf.level.upper()]
    renderer: structlog.typing.Processor
    if conf.format == "json":
        renderer = structlog.processors.JSONRenderer(serializer=_orjson_str)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.getLogger("aiohttp.server").addFilter(_quiet_parser_errors)


def _quiet_parser_errors(record: logging.LogRecord) -> bool:
    """aiohttp logs a request it cannot parse with a traceback whose text holds the bytes
    it choked on (a bearer token's first hundred characters, say): one event instead,
    naming only the kind of fault."""
    # Imported here: the router and the engine import this module and must not load aiohttp.
    from aiohttp.http_exceptions import HttpProcessingError

    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, HttpProcessingError):
        return True
    log.warning("http.bad_request", why=type(exc).__name__, status=exc.code)
    return False


def _orjson_str(obj: object, **_: object) -> str:
    return orjson.dumps(obj, default=str).decode()


@functools.lru_cache(maxsize=4096)  # a task's events name its owner two or three times
def owner_hash(owner: str) -> str:
    """A short stable digest of an owner identity, safe to log."""
    return hashlib.sha256(owner.encode()).hexdigest()[:12]


log = structlog.get_logger("gateway")
