// The wire vocabulary of the hub (docs/api.md), the same words as the Go
// package at the repository's root (wire.go, errors.go). A Go test
// (wire_test.go there) reads this file and index.d.ts and fails when a word
// is missing, extra or spelled differently.

/** Every error code the hub answers, and the client's own unexpected_response. */
export const codes = Object.freeze({
  invalidJSON: 'invalid_json',
  invalidField: 'invalid_field',
  invalidSurface: 'invalid_surface',
  invalidRuntimeMode: 'invalid_runtime_mode',
  reservedRuntimeMode: 'reserved_runtime_mode',
  unauthorized: 'unauthorized',
  forbidden: 'forbidden',
  recipientNotRegistered: 'recipient_not_registered',
  notFound: 'not_found',
  wrongInstance: 'wrong_instance',
  notAdaptivePlacement: 'not_adaptive_placement',
  historyChanged: 'history_changed',
  sessionExpired: 'session_expired',
  payloadTooLarge: 'payload_too_large',
  requestTimeout: 'request_timeout',
  tooManyRequests: 'too_many_requests',
  quotaExceeded: 'quota_exceeded',
  registryUnavailable: 'registry_unavailable',
  draining: 'draining',
  upgradeRequired: 'upgrade_required',
  internal: 'internal',
  badRequest: 'bad_request',
  headersTooLarge: 'headers_too_large',
  notImplemented: 'not_implemented',
  httpVersionNotSupported: 'http_version_not_supported',
  // The code of a MarconiError built from an answer that did not carry the
  // hub's error body (a proxy's page, an empty body); the hub never sends it.
  unexpectedResponse: 'unexpected_response',
});

/** The WebSocket close codes of the contract. */
export const closeCodes = Object.freeze({
  unauthorized: 4401,
  replaced: 4409,
  sessionExpired: 4410,
  slowConsumer: 4429,
  restarting: 1012,
  policy: 1008,
  messageTooBig: 1009,
  invalidPayload: 1007,
});

/**
 * The header naming a registered session's project, `<tenant_id>/<project_id>`,
 * on every request for the session, so that a load balancer can keep one
 * project's traffic on one instance (HeaderProject in wire.go). The hub
 * ignores it.
 */
export const projectHeader = 'x-marconi-project';

const routeID = /^[A-Za-z0-9._-]{1,128}$/;

/**
 * projectHeader's value for a session of tenant and project, or '' when
 * either is not an id of the contract (ProjectRoute in wire.go): the value
 * carries two ids and a slash, never a space or a line break.
 * @param {unknown} tenant
 * @param {unknown} project
 * @returns {string}
 */
export function projectRoute(tenant, project) {
  if (typeof tenant !== 'string' || typeof project !== 'string' || !routeID.test(tenant) || !routeID.test(project)) return '';
  return `${tenant}/${project}`;
}
