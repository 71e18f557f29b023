// Errors of the Marconi Node client.

/**
 * An error answered by the hub: the HTTP status and the stable code and
 * message of its {"error": {...}} body (docs/api.md lists the codes).
 */
export class MarconiError extends Error {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   * @param {{instanceURL?: string, retryAfterSeconds?: number}} [extra]
   */
  constructor(status, code, message, extra = {}) {
    super(`marconi hub: ${status} ${code}: ${message}`);
    this.name = 'MarconiError';
    /** HTTP status of the answer. */
    this.status = status;
    /** Stable error code, e.g. "recipient_not_registered". */
    this.code = code;
    /** The hub's human readable message. */
    this.hubMessage = message;
    /** Where the session's queue lives, on 409 wrong_instance. */
    this.instanceURL = extra.instanceURL;
    /** The Retry-After header in seconds, when the hub sent one. */
    this.retryAfterSeconds = extra.retryAfterSeconds;
  }
}

/** Thrown by calls on a client that was closed or deregistered. */
export class ClientClosedError extends Error {
  constructor() {
    super('marconi: client closed');
    this.name = 'ClientClosedError';
  }
}

/** Error codes the client acts on. */
export const codes = Object.freeze({
  sessionExpired: 'session_expired',
  wrongInstance: 'wrong_instance',
  // The code of a MarconiError built from an answer that did not carry the
  // hub's error body (a proxy's page, an empty body).
  unexpected: 'unexpected_response',
});

/**
 * Turns a non-2xx answer into a MarconiError. It never fails: a body that is
 * not the hub's error object still yields the status.
 * @param {number} status
 * @param {string} body
 * @param {string | null} [retryAfter] the Retry-After header
 * @returns {MarconiError}
 */
export function decodeError(status, body, retryAfter = null) {
  const seconds = retryAfter != null && /^\d+$/.test(retryAfter) ? Number(retryAfter) : undefined;
  let e;
  try {
    e = JSON.parse(body)?.error;
  } catch {
    e = undefined;
  }
  if (!e || typeof e.code !== 'string' || e.code === '') {
    let msg = body.trim().slice(0, 200);
    if (msg === '') msg = `HTTP ${status}`;
    return new MarconiError(status, codes.unexpected, msg, { retryAfterSeconds: seconds });
  }
  return new MarconiError(status, e.code, String(e.message ?? ''), {
    instanceURL: typeof e.instance_url === 'string' ? e.instance_url : undefined,
    retryAfterSeconds: seconds,
  });
}

/**
 * Reports whether err is an answer that retrying cannot change: a bad
 * request, a credential refused, a session that belongs to someone else.
 * @param {unknown} err
 */
export function permanent(err) {
  return err instanceof MarconiError && [400, 401, 403, 404].includes(err.status);
}
