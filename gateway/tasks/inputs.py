"""The server's input requests of running tasks (elicitation, sampling, roots) and the
client's answers to them: by key in the extension dialect (`tasks/update` inputResponses),
by JSON-RPC id in the core dialect (a response on the session). Each answer goes upstream
under the server's own id; the task works again once nothing is outstanding.
"""

from __future__ import annotations

from typing import Any

from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.tasks.report import Report
from gateway.tasks.run import TaskRun


class Inputs:
    def __init__(self, report: Report) -> None:
        self.report = report
        self._asked: dict[RequestId, TaskRun] = {}  # id an input request was sent on under -> run

    def asked(self, run: TaskRun, asked_id: RequestId) -> None:
        """`run`'s server asked for input under `asked_id` (a core client answers by it)."""
        self._asked[asked_id] = run

    def answer(self, run: TaskRun, responses: dict[str, Any]) -> None:
        """Answers by input key; unknown or already answered keys are ignored."""
        for key in [k for k in run.task.inputs if k in responses]:
            # Its id is set to the server's own by `answer`.
            self._asked.pop(run.answer(key, jsonrpc.result(0, responses[key])), None)
            self.report.answered(run.task, key)
        run.settle()

    def reply(self, msg: Message, owner: str) -> bool:
        """`owner`'s JSON-RPC answer (result or error) to an input request a task sent;
        False when it answers no request of a task of `owner`'s (another owner's task
        keeps waiting for its own client's answer: docs/architecture.md, Tenancy)."""
        run = self._asked.get(msg["id"])
        if run is None or run.task.owner != owner:
            return False
        key = run.key_of(msg["id"])
        if key is None:
            return False
        self._asked.pop(run.answer(key, msg), None)
        self.report.answered(run.task, key)
        run.settle()
        return True

    def forget(self, run: TaskRun) -> None:
        """The run ends: its requests can no longer be answered."""
        for asked_id in run.asked_ids():
            self._asked.pop(asked_id, None)
