// An authorization server for the gateway's OAuth tests: node's oidc-provider (the
// certified implementation), configured from the command line:
//   node idp.mjs PORT KEYS_FILE RESOURCE [TOKEN_TTL_S]
// KEYS_FILE: a JWK set with private keys (the tests make it; a new file and a restart is a
// key rotation). Clients: `robot` and `robot2` (client credentials, JWT access tokens), `opaque-robot`
// (client credentials, opaque tokens), `gateway` (may introspect), and any client that
// registers itself (RFC 7591) for the authorization code flow with PKCE. Login and consent are
// oidc-provider's development pages (any login name is accepted).
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const [port, keysFile, resource, ttlArg] = process.argv.slice(2);
const ttl = Number(ttlArg || 3600);
const issuer = `http://127.0.0.1:${port}`;
const secret = (id) => ({ client_id: id, client_secret: `${id}-secret`, redirect_uris: [],
  response_types: [], grant_types: ['client_credentials'] });

const provider = new Provider(issuer, {
  clients: [secret('robot'), secret('robot2'), secret('opaque-robot'), { ...secret('gateway'), grant_types: [] }],
  jwks: JSON.parse(readFileSync(keysFile, 'utf8')),
  scopes: ['openid', 'offline_access', 'tools', 'deploy'],
  cookies: { keys: ['idp-tests-cookie-key'] },
  findAccount: async (_ctx, id) => ({ accountId: id, claims: async () => ({ sub: id }) }),
  issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed('refresh_token'),
  clientBasedCORS: () => true,
  ttl: { AccessToken: ttl, ClientCredentials: ttl },
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    registration: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (_ctx, _client, oneOf) => oneOf ?? resource,
      useGrantedResource: async () => true,
      getResourceServerInfo: async (_ctx, indicator, client) => ({
        scope: 'tools deploy',
        audience: indicator,
        accessTokenTTL: ttl,
        accessTokenFormat: client.clientId === 'opaque-robot' ? 'opaque' : 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
});
provider.on('server_error', (_ctx, err) => { process.stderr.write(`${err.stack}\n`); });
provider.listen(Number(port), '127.0.0.1', () => {
  process.stdout.write(`listening ${issuer}\n`);
});
