"""basic.py plus two tools that never answer: "askhang" asks the client for input (elicitation)
first, "floodhang" sends many log lines first (tests/e2e/test_late_timers.py)."""
import asyncio
from pathlib import Path

src = (Path(__file__).parents[1] / "servers" / "basic.py").read_text()
src = src.rsplit("asyncio.run(main())", 1)[0]
ns: dict = {"__name__": "basic"}
exec(compile(src, "basic.py", "exec"), ns)
orig = ns["call_tool"]


async def call_tool(params: dict) -> dict:
    if params.get("name") == "askhang":
        await ns["ask"]("elicitation/create", {
            "message": "Name?",
            "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}}})
        await asyncio.Event().wait()
    if params.get("name") == "floodhang":  # many log lines, then never answers
        for i in range(int((params.get("arguments") or {}).get("lines", 20000))):
            ns["send"]({"jsonrpc": "2.0", "method": "notifications/message",
                        "params": {"level": "info", "data": "x" * 1000}})
            if i % 100 == 0:
                await asyncio.sleep(0)
        await asyncio.Event().wait()
    return await orig(params)


ns["call_tool"] = call_tool
ns["TOOLS"] += ["askhang", "floodhang"]
asyncio.run(ns["main"]())
