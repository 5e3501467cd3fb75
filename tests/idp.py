"""A real authorization server for the OAuth tests: node's oidc-provider (tests/node/idp.mjs)
in a subprocess, with keys the tests make (so a test can also sign a token the server never
would: expired, for another audience, with `alg: none`...)."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import jwt
from conftest import node_env
from cryptography.hazmat.primitives.asymmetric import rsa

IDP = Path(__file__).parent / "node" / "idp.mjs"


class Key:
    """An RSA signing key and its private JWK."""

    def __init__(self, kid: str) -> None:
        self.kid = kid
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.jwk = {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private)),
                    "kid": kid, "use": "sig", "alg": "RS256"}

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        return jwt.encode(claims, self.private, "RS256", headers={"kid": self.kid, **header})


class Idp:
    def __init__(self, port: int, resource: str, key: Key, ttl_s: int = 3600) -> None:
        self.port = port
        self.issuer = f"http://127.0.0.1:{port}"
        self.resource = resource
        self.ttl_s = ttl_s
        self.key = key
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.TemporaryDirectory()

    def start(self, key: Key | None = None) -> Idp:
        """Start (again, with `key` if given: a rotation) and wait until it listens."""
        self.stop()
        self.key = key or self.key
        keys = Path(self._dir.name) / f"{self.key.kid}.json"
        keys.write_text(json.dumps({"keys": [self.key.jwk]}))
        self.proc = subprocess.Popen(
            ["node", str(IDP), str(self.port), str(keys), self.resource, str(self.ttl_s)],
            env=node_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the authorization server never listened")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    async def token(self, http: aiohttp.ClientSession, client: str = "robot",
                    scope: str = "tools", resource: str | None = None) -> str:
        """An access token by the client credentials grant (RFC 6749 4.4) for `resource`
        (RFC 8707; the gateway's by default)."""
        form = {"grant_type": "client_credentials", "scope": scope,
                "resource": resource or self.resource}
        basic = base64.b64encode(f"{client}:{client}-secret".encode()).decode()
        async with http.post(f"{self.issuer}/token", data=form,
                             headers={"Authorization": f"Basic {basic}",
                                      "Connection": "close"}) as resp:  # it may restart
            body = await resp.json()
            assert resp.status == 200, body
            return str(body["access_token"])

    def claims(self, **extra: Any) -> dict[str, Any]:
        """What the server would put in a token for the gateway, now."""
        now = int(time.time())
        return {"iss": self.issuer, "sub": "forger", "aud": self.resource, "iat": now,
                "exp": now + 300, "scope": "tools", **extra}
