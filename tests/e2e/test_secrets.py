"""The gateway's secrets stay in the gateway (DESIGN.md, Secrets; README, Security): what a
stdio server it starts can read of its environment."""

from __future__ import annotations

import json

import pytest
from mcp_http import text_of

from gateway.upstream.stdio import DEFAULT_ENV


async def test_a_stdio_server_starts_with_a_short_environment(gateway, client, monkeypatch
                                                              ) -> None:
    """Before: every stdio server read the gateway's whole environment (its token, the
    replica secret, the store's URL with its password) from /proc/self/environ."""
    for name, value in {"GATEWAY_TOKEN": "s3cret-token", "GATEWAY_SECRET": "replica-key",
                        "REDIS_URL": "redis://:pw@store:6379", "PASS_ME_ON": "wanted"}.items():
        monkeypatch.setenv(name, value)
    url = await gateway(upstream={"env": {"GIVEN": "by config", "PATH": "/usr/bin:/bin"},
                                  "inherit_env": ["PASS_ME_ON", "NOT_SET_ANYWHERE"]})
    mcp = client(url)
    await mcp.initialize()
    env = json.loads(text_of(await mcp.call("environ")))
    assert not {"GATEWAY_TOKEN", "GATEWAY_SECRET", "REDIS_URL"} & set(env)
    assert "s3cret-token" not in json.dumps(env) and "pw@" not in json.dumps(env)
    assert set(env) <= {*DEFAULT_ENV, "PASS_ME_ON", "GIVEN"}
    assert (env["PASS_ME_ON"], env["GIVEN"], env["PATH"]) == ("wanted", "by config",
                                                              "/usr/bin:/bin")


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", ""])
def test_inherit_env_takes_variable_names_only(name: str) -> None:
    from gateway.settings import ConfigError, from_mapping
    with pytest.raises(ConfigError):
        from_mapping({"upstreams": {"main": {"command": "x", "inherit_env": [name]}}})
