"""A single gateway's finished tasks across its restart: the memory store's records written
to one file (`store.snapshot_path`) when the gateway stops, and read back when it starts.
This module owns that file and its key; what is taken back, and within which bounds, is the
store's (`MemoryStore.load`: records past their ttl left, the newest kept where a bound is
reached, a task that had not ended taken as failed).

The file: a first line naming it and its version (MAGIC), then `nonce || ciphertext || tag`
(AES-256-GCM, keyring.Cipher) of the JSON `{"tasks": [Task.record(), ...], "read": [ids]}`,
`read` the ids of read tasks in the order first read. The first line is the associated data:
a file of another version is not read as this one. A result is embedded as the JSON it is
and comes back as orjson writes it, which is as it was kept (the engine keeps every result
as orjson wrote it).

The key (`key_of`): with `replica.secret`, one derived from it (keyring "snapshot"), which
never lies beside the file; without one, a random key in a file of its own beside the
snapshot (PATH.key, mode 0600). That key file guards against a snapshot swapped or corrupted
(one that does not decrypt is not read), not against whoever can read the volume both lie
on: where that matters, set `replica.secret`.

Writing is atomic: a temporary file in the same directory, written and synced, then renamed
over the old one, and the directory synced; a failure (a crash, a full disk) leaves the old
file as it was, and no temporary file. Mode 0600.

What is never done: refuse to start. A snapshot missing, unreadable, of another version or
another key, or malformed, is one warning (`store.snapshot_unreadable`, saying why) and the
gateway starts empty; a snapshot that cannot be written is one warning
(`store.snapshot_failed`). No event holds a record's data or the key.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

import orjson

from gateway.keyring import Cipher, derive
from gateway.observability import log
from gateway.tasks.model import Task
from gateway.tasks.store.memory import MemoryStore

MAGIC = b"mcp-task-gateway snapshot 1\n"  # the first line: what the file is, its version
_NAMED = b"mcp-task-gateway snapshot "  # ... whatever its version
KEY_BYTES = 32
# A record's fields of a type the store computes with: a record of other types is malformed.
_TYPES: dict[str, type | tuple[type, ...]] = {
    "id": str, "owner": str, "quota": str, "tool": str, "upstream": str, "replica": str,
    "ttl_ms": (int, type(None)), "poll_interval_ms": int, "created_at": (int, float),
    "updated_at": (int, float), "size": int, "status_message": (str, type(None)),
    "error": (dict, type(None)), "inputs": dict}


class _Unreadable(Exception):
    """A snapshot not read; the message says why, in a few words."""


def key_of(path: str, secret: bytes | None) -> bytes:
    """The key that seals the snapshot at `path`: derived from the replicas' secret where
    there is one; else the random key of the file `path + ".key"`, made when missing (a key
    file of the wrong size is replaced: the snapshot it sealed is then not read). A key file
    that cannot be read or made: a key for this life only (one warning)."""
    if secret is not None:
        return derive(secret, "snapshot")
    try:
        return _key_file(path + ".key")
    except OSError as exc:
        log.warning("store.snapshot_failed", path=path, why=f"key file: {_why(exc)}")
        return os.urandom(KEY_BYTES)


def _key_file(path: str) -> bytes:
    try:
        with open(path, "rb") as file:
            key = file.read(KEY_BYTES + 1)
    except FileNotFoundError:
        return _new_key(path)
    if len(key) == KEY_BYTES:
        if os.stat(path).st_mode & 0o077:  # readable by others: whoever reads it opens the file
            log.warning("store.snapshot_key_exposed", path=path, why="readable by others")
        return key
    kept = _set_aside(path)  # kept, not deleted: the snapshot it sealed may yet be wanted
    log.warning("store.snapshot_key_replaced", path=path, why="wrong size", kept_as=kept)
    return _new_key(path)


def _new_key(path: str) -> bytes:
    key = os.urandom(KEY_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(key)
        file.flush()
        os.fsync(file.fileno())
    return key


def save(store: MemoryStore, path: str, key: bytes) -> int:
    """Write every record of `store` to `path`, atomically; how many. Never raises: a
    failure is one warning (`store.snapshot_failed`), the old file left as it was, and 0."""
    tasks, read = store.records()
    try:
        body = orjson.dumps({"tasks": [t.record() for t in tasks], "read": read})
        data = MAGIC + Cipher(key).encrypt(body, MAGIC)
        _write(path, data)
    except (OSError, ValueError, TypeError) as exc:  # orjson's JSONEncodeError: a TypeError
        log.warning("store.snapshot_failed", path=path, why=_why(exc))
        return 0
    log.info("store.snapshot_written", path=path, tasks=len(tasks), bytes=len(data))
    return len(tasks)


def _write(path: str, data: bytes) -> None:
    """`data` in place of `path`'s content, all or nothing, durably."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _sync_directory(directory)


def _sync_directory(directory: str) -> None:
    """The rename made durable: a crash after it cannot bring the old file back."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(store: MemoryStore, path: str, key: bytes) -> int:
    """Take the snapshot at `path` into `store` (empty: a fresh one, at start); how many
    records it kept. Never raises, never refuses: no file is 0 (`store.snapshot_none`), a
    file not read is one warning (`store.snapshot_unreadable`) and 0."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        log.info("store.snapshot_none", path=path)
        return 0
    except OSError as exc:
        return _unreadable(path, _why(exc))
    try:
        tasks, read = _parse(data, key)
    except _Unreadable as exc:
        return _unreadable(path, str(exc), _set_aside(path))
    kept = store.load(tasks, read)
    log.info("store.snapshot_read", path=path, tasks=kept, dropped=len(tasks) - kept)
    return kept


def _unreadable(path: str, why: str, kept_as: str | None = None) -> int:
    log.warning("store.snapshot_unreadable", path=path, why=why, kept_as=kept_as)
    return 0


def _set_aside(path: str) -> str | None:
    """A file not read, kept beside under `.unreadable` (replacing an earlier one), so
    that the next stop's write does not destroy it (review of issue 48): an operator who
    set replica.secret since, or restored the wrong key, can still get it back. Its name;
    None where it could not be moved."""
    aside = path + ".unreadable"
    try:
        os.replace(path, aside)
    except OSError:
        return None
    return aside


def _parse(data: bytes, key: bytes) -> tuple[list[Task], list[str]]:
    """The records and read ids a snapshot holds; _Unreadable where it holds none."""
    if not data.startswith(MAGIC):
        raise _Unreadable("another version" if data.startswith(_NAMED) else "missing magic")
    plain = Cipher(key).decrypt(data[len(MAGIC):], MAGIC)
    if plain is None:
        raise _Unreadable("another key or corrupt")
    try:
        held = orjson.loads(plain)
        tasks = [_task(record) for record in held["tasks"]]
        read = held["read"]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise _Unreadable("malformed") from exc
    if not isinstance(read, list) or not all(isinstance(i, str) for i in read):
        raise _Unreadable("malformed")
    return tasks, read


def _task(record: Any) -> Task:
    """The task of one record; TypeError for a record that is not one."""
    task = Task.from_record(record)  # unknown or missing fields: TypeError; status: ValueError
    if not all(isinstance(getattr(task, name), kind) for name, kind in _TYPES.items()):
        raise TypeError("a field of another type")
    return task


def _why(exc: BaseException) -> str:
    """A failure in a few words (an OSError's reason without the path it names)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__


__all__ = ["KEY_BYTES", "MAGIC", "key_of", "load", "save"]
