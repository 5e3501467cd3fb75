"""Push: a task's status sent to webhooks when it ends (or asks for input), signed as
Standard Webhooks says, delivered at least once (docs/push.md). The engine's report tells
`Pusher` each status written here; everything else (what is sent, to whom, when again) is
this package's. tasks/ never imports it.
"""
