"""The audience of one upstream, alone (upstream/audience.py): the log level the server is
set to for its owners, and the subscriptions they hold."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.upstream.audience import Audience


@dataclass
class Owner:
    key: str
    principal: str = "p"
    level: str | None = None


def test_the_server_keeps_its_own_level_until_an_owner_asks() -> None:
    audience: Audience[Owner] = Audience()
    assert audience.next_level() is None  # nobody attached
    audience.attach(Owner("a"))
    assert audience.next_level() is None and not audience.levels_set


def test_the_most_verbose_level_asked_and_each_change_once() -> None:
    audience: Audience[Owner] = Audience()
    quiet, chatty = Owner("q", level="error"), Owner("c", level="debug")
    audience.attach(quiet)
    assert audience.next_level() == "error" and audience.levels_set
    assert audience.next_level() is None  # set already
    audience.attach(chatty)
    assert audience.next_level() == "debug"
    audience.detach(chatty)
    assert audience.next_level() == "error"
    audience.attach(Owner("n"))  # asked none: DEFAULT_LEVEL, once the server was set
    assert audience.next_level() == "info"


def test_a_restarted_server_is_set_again() -> None:
    audience: Audience[Owner] = Audience()
    audience.attach(Owner("a", level="warning"))
    assert audience.next_level() == "warning"
    audience.restarted()
    assert not audience.levels_set and audience.next_level() == "warning"


def test_one_subscription_per_uri_until_the_server_confirms_it() -> None:
    audience: Audience[Owner] = Audience()
    assert audience.hold("r://b") and audience.hold("r://b")  # not confirmed: both send
    audience.confirm("r://b")
    assert not audience.hold("r://b")  # a third holder needs none
    assert audience.hold("r://a") and audience.held() == ["r://a", "r://b"]
    assert not audience.release("r://b") and not audience.release("r://b")
    assert audience.release("r://b") and audience.held() == ["r://a"]
    assert audience.hold("r://b")  # the last holder let it go: a new one sends again
