"""Who hears what one upstream says to no call in particular, and what they hold of it:
pure, no I/O. A peer of its connection's correlator (both owned by the connection): the
correlator and targeting.py read it to route a message of no call; the connection and
downstream change it with its verbs.

It keeps the owners attached (legacy sessions: server requests and broadcasts reach them),
the watchers (listen streams: broadcasts only), the principals whose calls just ended (a late
line may be theirs), the resource subscriptions held for them all (the upstream keeps one
subscription per URI, whoever holds it) and the log level the server was set to for them.

Generic over the correlator's owners (as targeting.py and task_owners.py are), so that this
module needs nothing of correlator.py's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from gateway.protocol import mcp
from gateway.upstream.targeting import Party

# A principal whose call was answered this recently may still be the one a message of no
# call is about (a late log line): while another is, such a message goes to nobody. Longer
# catches later lines, and drops more of the lines of calls that follow another principal's.
RECENT_S = 2.0
DEFAULT_LEVEL = "info"  # what an owner that set no level hears once the server was set


class Hearer(Party, Protocol):
    """What the audience reads of an owner (correlator.py: Owner): what targeting does, and
    the log level it asked for."""

    @property
    def level(self) -> str | None: ...


HearerT = TypeVar("HearerT", bound=Hearer)


class Audience(Generic[HearerT]):
    """The owners and watchers of one upstream link, the subscriptions they hold and the
    log level the server was set to for them."""

    def __init__(self) -> None:
        self.owners: dict[str, HearerT] = {}
        self.watchers: dict[str, HearerT] = {}
        self._subscriptions: Counter[str] = Counter()  # resource URI -> holders
        self._confirmed: set[str] = set()  # URIs the server took a subscribe of
        self._level: str | None = None  # the log level the server was set to, if ever
        self._recently: dict[str, float] = {}  # principal -> when a call of its was answered

    # -- who hears --------------------------------------------------------------------------
    def attach(self, owner: HearerT) -> None:
        self.owners[owner.key] = owner

    def detach(self, owner: HearerT) -> None:
        self.owners.pop(owner.key, None)

    def watch(self, owner: HearerT) -> None:
        self.watchers[owner.key] = owner

    def unwatch(self, owner: HearerT) -> None:
        self.watchers.pop(owner.key, None)

    def only_owner(self) -> HearerT | None:
        """The owner a message for no call can belong to: the one attached, if only one."""
        return next(iter(self.owners.values())) if len(self.owners) == 1 else None

    def answered(self, principal: str) -> None:
        """A call of `principal`'s was answered now (a late line of it may follow)."""
        self._recently[principal] = time.monotonic()

    def recent(self) -> set[str]:
        """The principals whose calls were answered in the last RECENT_S seconds."""
        cutoff = time.monotonic() - RECENT_S
        for principal in [p for p, at in self._recently.items() if at < cutoff]:
            del self._recently[principal]
        return set(self._recently)

    def present(self) -> set[str]:
        """The principals a message of no call may concern: whose sessions and listen
        streams hear this upstream, and whose calls were answered moments ago."""
        return {*self.recent(), *(o.principal for o in self.owners.values()),
                *(o.principal for o in self.watchers.values())}

    def hearing(self, want: Callable[[HearerT], bool]) -> list[HearerT]:
        """The owners and watchers a broadcast reaches: those `want` takes."""
        return [o for o in [*self.owners.values(), *self.watchers.values()] if want(o)]

    # -- the log level ------------------------------------------------------------------------
    @property
    def levels_set(self) -> bool:
        """Whether the server was set to a level for its owners (what an owner that asked
        none heard before, the server's own default, is gone then)."""
        return self._level is not None

    def restarted(self) -> None:
        """A new process logs at its own default until it is set again."""
        self._level = None

    def next_level(self) -> str | None:
        """The level a legacy server is to be set to now, or None to leave it as it is
        (noted as set when not None). Once an owner asked for a level, it is the most
        verbose level any attached owner hears (those that asked none: DEFAULT_LEVEL); each
        owner is given its own level and above (correlator.py `_wanted`). Until then the
        server is left at its own default."""
        asked = any(o.level is not None for o in self.owners.values())
        if not self.owners or not (asked or self._level is not None):
            return None
        level = min((o.level or DEFAULT_LEVEL for o in self.owners.values()),
                    key=mcp.LOG_LEVELS.index)
        if level == self._level:
            return None
        self._level = level
        return level

    # -- resource subscriptions -------------------------------------------------------------
    def held(self) -> list[str]:
        """The URIs some owner holds a subscription of, sorted."""
        return sorted(self._subscriptions)

    def hold(self, uri: str) -> bool:
        """One more holder of a resource subscription; True while the upstream has not
        confirmed one (the first holder's subscribe may yet fail: then the next holder's
        must reach the server too, or it would hold what the server never took)."""
        self._subscriptions[uri] += 1
        return uri not in self._confirmed

    def confirm(self, uri: str) -> None:
        """The server took a subscribe of `uri`: later holders need not send one."""
        if self._subscriptions[uri] > 0:
            self._confirmed.add(uri)

    def release(self, uri: str) -> bool:
        """One holder fewer; True when it was the last."""
        if self._subscriptions[uri] > 1:
            self._subscriptions[uri] -= 1
            return False
        self._subscriptions.pop(uri, None)
        self._confirmed.discard(uri)
        return True


__all__ = ["DEFAULT_LEVEL", "RECENT_S", "Audience", "Hearer"]
