// An authorization server for the gateway's OAuth tests: node's oidc-provider (the
// certified implementation), configured from the command line:
//   node idp.mjs PORT KEYS_FILE RESOURCE [TOKEN_TTL_S]
// KEYS_FILE: a JWK set with private keys (the tests make it; a new file and a restart is a
// key rotation), or - for a key made at start. Clients: `robot` and `robot2` (client credentials, JWT access tokens), `opaque-robot`
// (client credentials, opaque tokens), `operator` (client credentials; the only one granted
// the gateway's admin scope `gateway:admin`), `gateway` (may introspect), and any client that
// registers itself (RFC 7591) for the authorization code flow with PKCE. Login and consent are
// oidc-provider's development pages (any login name is accepted). `gateway` may also exchange
// a token (RFC 8693, a grant oidc-provider leaves to its users: registered below) for one
// meant for another audience, acting for the token's subject.
import { readFileSync } from 'node:fs';
import { SignJWT, createLocalJWKSet, exportJWK, generateKeyPair, importJWK, jwtVerify } from 'jose';
import Provider, { errors } from 'oidc-provider';

const [port, keysFile, resource, ttlArg] = process.argv.slice(2);
const ttl = Number(ttlArg || 3600);
const issuer = `http://127.0.0.1:${port}`;
const EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';
const ADMIN_SCOPE = 'gateway:admin';  // config/oauth.yaml's auth.oauth.admin_scopes
const made = async () => {
  const { privateKey } = await generateKeyPair('RS256', { extractable: true });
  return { keys: [{ ...await exportJWK(privateKey), kid: 'k0', use: 'sig', alg: 'RS256' }] };
};
const keys = keysFile === '-' ? await made() : JSON.parse(readFileSync(keysFile, 'utf8'));
const secret = (id) => ({ client_id: id, client_secret: `${id}-secret`, redirect_uris: [],
  response_types: [], grant_types: ['client_credentials'] });

const provider = new Provider(issuer, {
  clients: [secret('robot'), secret('robot2'), secret('opaque-robot'), secret('operator'),
    { ...secret('gateway'), grant_types: [EXCHANGE] }],
  jwks: structuredClone(keys),  // it keeps (and changes) what it is given
  scopes: ['openid', 'offline_access', 'tools', 'deploy', ADMIN_SCOPE],
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
        scope: client.clientId === 'operator' ? `tools deploy ${ADMIN_SCOPE}` : 'tools deploy',
        audience: indicator,
        accessTokenTTL: ttl,
        accessTokenFormat: client.clientId === 'opaque-robot' ? 'opaque' : 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
});
// RFC 8693: a valid access token of this server, traded for one for `audience`, whose
// subject is the same and whose `act` names the client that asked.
const publicKeys = createLocalJWKSet({ keys: keys.keys.map(({ d, p, q, dp, dq, qi, key_ops: _ops, ...pub }) => pub) });
provider.registerGrantType(EXCHANGE, async (ctx) => {
  const { subject_token: subjectToken, subject_token_type: type, audience, scope } = ctx.oidc.params;
  if (type !== ACCESS_TOKEN) throw new errors.InvalidRequest('unsupported subject_token_type');
  let subject;
  try {
    ({ payload: subject } = await jwtVerify(subjectToken, publicKeys, { issuer }));
  } catch (err) {
    if (process.env.IDP_DEBUG) process.stderr.write(`${err}\n`);
    throw new errors.InvalidGrant('subject_token is not valid');
  }
  const key = keys.keys[0];
  const now = Math.floor(Date.now() / 1000);
  const token = await new SignJWT({ scope: scope ?? subject.scope, client_id: ctx.oidc.client.clientId,
                                    act: { sub: ctx.oidc.client.clientId } })
    .setProtectedHeader({ alg: 'RS256', kid: key.kid, typ: 'at+jwt' })
    .setIssuer(issuer).setSubject(subject.sub).setAudience(audience ?? subject.aud)
    .setIssuedAt(now).setExpirationTime(now + ttl).sign(await importJWK(key, 'RS256'));
  ctx.body = { access_token: token, issued_token_type: ACCESS_TOKEN, token_type: 'Bearer',
               expires_in: ttl };
}, ['subject_token', 'subject_token_type', 'requested_token_type', 'audience', 'scope']);
provider.on('server_error', (_ctx, err) => { process.stderr.write(`${err.stack}\n`); });
provider.listen(Number(port), '127.0.0.1', () => {
  process.stdout.write(`listening ${issuer}\n`);
});
