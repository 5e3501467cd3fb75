#!/usr/bin/env python3
"""What sealing task records costs (issue 30): a Redis store whose records are sealed and
encrypted (as every shared store now is) against the same store given no secret, in
alternating rounds of one run against one redis-server. For each: tasks created a second
(a creation and its end with a result of --result bytes, as a task's life writes them, 32
at a time) and tasks read a second (tasks/get of a record this replica has not cached: one
round trip to the store each, 32 at a time); and the CPU time of sealing and opening one
record alone. Needs redis-server (or valkey-server) on PATH.

With `--base TREE` (a worktree of the commit before, as for bench/ab.py), the same through
HTTP too: one gateway replica on Redis from each tree in alternating rounds, tasks created
a second (mode always, a 5 ms call each, 32 at a time) and tasks/get a second (finished
tasks, 32 at a time; answered from the replica's cache of finished records, as in use).

    git worktree add /tmp/before <commit>
    .venv/bin/python bench/sealing.py --base /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parents[1]))
from replicas import create, redis_server
from tasks import poll, running, task_gateway

from bench import free_port
from gateway.tasks.model import Status, Task, new_id
from gateway.tasks.store import StoreBounds
from gateway.tasks.store.redis import RedisStore
from gateway.tasks.store.vault import Stored, Vault

SECRET = b"the bench's replica secret, 32 chars"
CONCURRENCY = 32


def made() -> Task:
    return Task(new_id(), "0123456789abcdef0123456789abcdef", "render", "extension",
                3_600_000, 500, upstream="main", replica="r0")


async def spread(n: int, step: object) -> float:
    """Seconds for `step(i)` over range(n), CONCURRENCY at a time."""
    todo = iter(range(n))

    async def worker() -> None:
        for i in todo:
            await step(i)  # type: ignore[operator]

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return time.perf_counter() - start


async def one_round(url: str, sealed: bool, n: int, result: bytes, prefix: str
                    ) -> tuple[float, float]:
    """(tasks created a second, tasks read a second)."""
    secret = SECRET if sealed else None
    bounds = (n + 10, n + 10, len(result) + 100, (n + 10) * (len(result) + 100))
    writer = RedisStore(url, prefix, StoreBounds.given(*bounds), replica="r0", secret=secret)
    reader = RedisStore(url, prefix, StoreBounds.given(*bounds), replica="r1", secret=secret)
    tasks = [made() for _ in range(n)]

    async def create(i: int) -> None:
        task = tasks[i]
        await writer.create(task)
        task.result, task.size = result, len(result)
        task.move(Status.COMPLETED, now=time.time())
        await writer.save(task)

    async def read(i: int) -> None:
        got = await reader.get(tasks[i].id)
        assert got is not None and got.result == result

    try:
        created = n / await spread(n, create)
        read_s = n / await spread(n, read)
    finally:
        await writer.redis.flushdb()
        await writer.close()
        await reader.close()
    return created, read_s


def vault_us(result: bytes, sealed: bool, n: int = 20_000) -> tuple[float, float]:
    """CPU µs to make one record's stored form and to read it back (decoding included),
    alone."""
    stored = Stored(Vault(SECRET) if sealed else None)
    task = made()
    task.result, task.size = result, len(result)
    rec = orjson.dumps({k: v for k, v in task.record().items() if k != "result"})
    start = time.process_time()
    for _ in range(n):
        kept, res, seal = stored.close(task, rec, result)
    closing = (time.process_time() - start) / n * 1e6
    held = [kept, res, task.owner.encode(), seal]
    start = time.process_time()
    for _ in range(n):
        stored.open(task.id, held)
    return closing, (time.process_time() - start) / n * 1e6


async def through_http(tree: Path, port: int, n: int, prefix: str) -> tuple[float, float]:
    """(tasks created a second, tasks/get a second) of one replica run from `tree`."""
    conf = task_gateway(free_port(), n)
    conf["store"] = {"backend": "redis", "url": f"redis://127.0.0.1:{port}/0",
                     "key_prefix": prefix}
    conf["replica"] = {"id": "r0", "secret": SECRET.decode()}
    async with running(conf, tree) as (_, client):
        start = time.perf_counter()
        ids = await create([client], n)  # 5 ms calls (an echo ends before it is stored)
        created = len(ids) / (time.perf_counter() - start)
        await asyncio.sleep(1)  # all ended
        polled = await poll(client, ids, n, CONCURRENCY)
    return created, polled["rps"]


async def http_rounds(base: Path, port: int, n: int, rounds: int) -> None:
    here = Path(__file__).resolve().parents[1]
    figures: dict[Path, list[tuple[float, float]]] = {base: [], here: []}
    for r in range(rounds):
        for tree in (base, here) if r % 2 == 0 else (here, base):
            figures[tree].append(await through_http(tree, port, n, f"http{r}{tree.name}:"))
    print(f"through HTTP, one replica on Redis, {n} tasks a round, {rounds} rounds (medians):")
    for tree, name in ((base, "before"), (here, "sealed, encrypted")):
        created = statistics.median(c for c, _ in figures[tree])
        got = statistics.median(g for _, g in figures[tree])
        print(f"  {name:20} {created:8.0f} tasks created/s  {got:8.0f} tasks/get/s")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--result", type=int, default=1024, help="bytes of each task's result")
    ap.add_argument("--base", type=Path, help="a worktree of the commit before: HTTP too")
    ap.add_argument("--http-tasks", type=int, default=3000)
    args = ap.parse_args()
    text = "x" * max(args.result - 40, 1)
    result = orjson.dumps({"content": [{"type": "text", "text": text}]})
    figures: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with redis_server() as port:
        url = f"redis://127.0.0.1:{port}/0"
        for r in range(args.rounds):
            for sealed in (False, True) if r % 2 == 0 else (True, False):
                figures[sealed].append(await one_round(url, sealed, args.tasks, result,
                                                       f"bench{r}:"))
        if args.base is not None:
            await http_rounds(args.base.resolve(), port, args.http_tasks, args.rounds)
    print(f"{args.tasks} tasks a round, {args.rounds} rounds alternating, results of "
          f"{len(result)} bytes, {CONCURRENCY} at a time (medians):")
    for sealed in (False, True):
        created = statistics.median(c for c, _ in figures[sealed])
        read = statistics.median(g for _, g in figures[sealed])
        name = "sealed, encrypted" if sealed else "no secret (before)"
        print(f"  {name:20} {created:8.0f} tasks created/s  {read:8.0f} tasks read/s")
    for sealed in (False, True):
        closing, opening = vault_us(result, sealed)
        name = "sealed, encrypted" if sealed else "no secret (before)"
        print(f"  {name:20} one record stored in {closing:.1f} µs CPU, read back (decoded) "
              f"in {opening:.1f} µs")


if __name__ == "__main__":
    asyncio.run(main())
