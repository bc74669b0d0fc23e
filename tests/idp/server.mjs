// Local OpenID provider for floodgate's integration tests.
//
// Built on oidc-provider. Listens on 127.0.0.1 only, issues JWT access tokens
// through the client_credentials grant, and signs them with a key pair that is
// generated afresh at every start (so a restart rotates the key).
//
// Environment:
//   IDP_PORT    (required) port; the issuer is http://127.0.0.1:$IDP_PORT
//   IDP_ALG     signing algorithm, ES256 (default) or RS256
//   IDP_KID     force the key id (default: random)
//   IDP_TTL     access token lifetime in seconds (default 300)
//   IDP_TENANT  default "tenant" claim (default "acme")
//   IDP_PLAN    default "plan" claim (default "pro")
//
// A token request may also carry tenant=, plan= and rate_limit= form
// parameters to override those claims for that one token.
//
// On start it prints exactly one line to stdout:
//   ready http://127.0.0.1:PORT kid=<kid>

import * as crypto from 'node:crypto';
import * as http from 'node:http';
import * as querystring from 'node:querystring';

// stdout carries only the "ready" line. oidc-provider prints its notices with
// console.info (stdout); send them to stderr along with its warnings. The one
// warning about an already parsed request body is expected (see the token
// request middleware below) and is dropped.
const warn = console.warn.bind(console);
console.info = (...args) => warn(...args);
console.log = (...args) => warn(...args);
console.warn = (...args) => {
  if (typeof args[0] === 'string' && args[0].includes('already parsed request body detected')) return;
  warn(...args);
};

const { default: Provider } = await import('oidc-provider');

function fail(message) {
  process.stderr.write(`idp: ${message}\n`);
  process.exit(2);
}

const port = Number.parseInt(process.env.IDP_PORT ?? '', 10);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  fail('IDP_PORT must be set to a TCP port (1-65535)');
}

const alg = process.env.IDP_ALG || 'ES256';
const KEYGEN = {
  ES256: () => crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' }),
  RS256: () => crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }),
};
if (!KEYGEN[alg]) {
  fail(`IDP_ALG must be one of ${Object.keys(KEYGEN).join(', ')} (got ${alg})`);
}

const ttl = Number.parseInt(process.env.IDP_TTL || '300', 10);
if (!Number.isInteger(ttl) || ttl <= 0) {
  fail('IDP_TTL must be a positive number of seconds');
}

const defaultTenant = process.env.IDP_TENANT || 'acme';
const defaultPlan = process.env.IDP_PLAN || 'pro';

const issuer = `http://127.0.0.1:${port}`;
const kid = process.env.IDP_KID || crypto.randomBytes(12).toString('base64url');

// Fresh signing key at every start.
const { privateKey } = KEYGEN[alg]();
const jwk = {
  ...privateKey.export({ format: 'jwk' }), kid, alg, use: 'sig',
};

const SCOPE = 'orders:read orders:write';
const DEFAULT_AUDIENCE = 'orders-api';

// oidc-provider only accepts absolute URIs as resource indicators (RFC 8707).
// To let tests send `resource=orders-api`, a bare name is rewritten to
// `urn:floodgate-idp:<name>` before the provider sees it, and that resource
// server's audience is the bare name again. Absolute URIs are used as they are,
// with the URI itself as the audience.
const RESOURCE_PREFIX = 'urn:floodgate-idp:';
const BARE_NAME = /^[A-Za-z0-9._~-]+$/;

function audienceOf(resourceIndicator) {
  return resourceIndicator.startsWith(RESOURCE_PREFIX)
    ? resourceIndicator.slice(RESOURCE_PREFIX.length)
    : resourceIndicator;
}

const configuration = {
  // oidc-provider 8 accepts client_secret_post and client_secret_basic alike
  // for a client registered with either of them.
  clients: [{
    client_id: 'orders-client',
    client_secret: 'orders-secret',
    grant_types: ['client_credentials'],
    response_types: [],
    redirect_uris: [],
    scope: SCOPE,
    token_endpoint_auth_method: 'client_secret_post',
  }],
  jwks: { keys: [jwk] },
  scopes: SCOPE.split(' '),
  clientDefaults: {
    id_token_signed_response_alg: alg,
    grant_types: ['client_credentials'],
    response_types: [],
    token_endpoint_auth_method: 'client_secret_post',
  },
  cookies: { keys: [crypto.randomBytes(32).toString('base64url')] },
  ttl: { ClientCredentials: ttl },
  // There are no end users; this is never called for client_credentials.
  findAccount: async () => undefined,
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (_ctx, _client, oneOf) => oneOf ?? `${RESOURCE_PREFIX}${DEFAULT_AUDIENCE}`,
      getResourceServerInfo: async (_ctx, resourceIndicator) => ({
        audience: audienceOf(resourceIndicator),
        scope: SCOPE,
        accessTokenTTL: ttl,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg } },
      }),
    },
  },
  extraTokenClaims: async (ctx) => {
    const overrides = ctx?.state?.idpOverrides ?? {};
    return {
      tenant: overrides.tenant ?? defaultTenant,
      plan: overrides.plan ?? defaultPlan,
      rate_limit: overrides.rate_limit ?? 5,
      realm_access: { roles: ['orders-admin', 'reader'] },
      'https://example.com/tenant': 'acme-url',
    };
  },
};

const provider = new Provider(issuer, configuration);

// Pre-processing of token requests: read the form body, pick up the optional
// claim overrides (tenant, plan, rate_limit), default the scope, rewrite bare
// resource names, and hand the resulting form on to oidc-provider as req.body.
provider.use(async (ctx, next) => {
  if (ctx.method !== 'POST' || ctx.path !== '/token' || !ctx.is('application/x-www-form-urlencoded')) {
    return next();
  }

  const chunks = [];
  let size = 0;
  for await (const chunk of ctx.req) {
    size += chunk.length;
    if (size > 56 * 1024) ctx.throw(413, 'request entity too large');
    chunks.push(chunk);
  }
  const form = querystring.parse(Buffer.concat(chunks).toString('utf8'));

  const overrides = {};
  if (typeof form.tenant === 'string' && form.tenant) overrides.tenant = form.tenant;
  if (typeof form.plan === 'string' && form.plan) overrides.plan = form.plan;
  if (typeof form.rate_limit === 'string' && /^\d+$/.test(form.rate_limit)) {
    overrides.rate_limit = Number(form.rate_limit);
  }
  ctx.state.idpOverrides = overrides;

  // No scope parameter at all: grant every scope of the client.
  // (An empty `scope=` still yields a token without scope.)
  if (form.scope === undefined) form.scope = SCOPE;

  if (form.resource !== undefined) {
    const rewrite = (value) => (BARE_NAME.test(value) ? `${RESOURCE_PREFIX}${value}` : value);
    form.resource = Array.isArray(form.resource) ? form.resource.map(rewrite) : rewrite(form.resource);
  }

  // The request stream is consumed now; oidc-provider then falls back to
  // req.body, which it parses as a form itself.
  ctx.req.body = querystring.stringify(form);
  return next();
});

const server = http.createServer(provider.callback());

server.listen(port, '127.0.0.1', () => {
  process.stdout.write(`ready ${issuer} kid=${kid}\n`);
});

server.on('error', (err) => fail(`cannot listen on 127.0.0.1:${port}: ${err.message}`));

function shutdown() {
  server.close(() => process.exit(0));
  server.closeAllConnections?.();
  setTimeout(() => process.exit(0), 2000).unref();
}

process.on('SIGINT', shutdown);
process.on('SIGTERM', shutdown);
