// Errors of the Marconi Node client.

import { codes } from './codes.js';

/** @typedef {import('../index.js').ErrorCode} ErrorCode */

/**
 * An error answered by the hub: the HTTP status and the stable code and
 * message of its {"error": {...}} body (docs/api.md lists the codes).
 */
export class MarconiError extends Error {
  /**
   * @param {number} status
   * @param {ErrorCode} code
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

/**
 * Turns a non-2xx answer into a MarconiError. It never fails: a body that is
 * not the hub's error object still yields the status.
 * @param {number} status
 * @param {string} body
 * @param {string | null} [retryAfter] the Retry-After header
 * @returns {MarconiError}
 */
export function decodeError(status, body, retryAfter = null) {
  const seconds = parseRetryAfter(retryAfter, Date.now());
  let e;
  try {
    e = JSON.parse(body)?.error;
  } catch {
    e = undefined;
  }
  if (!e || typeof e.code !== 'string' || e.code === '') {
    let msg = body.trim().slice(0, 200);
    if (msg === '') msg = `HTTP ${status}`;
    return new MarconiError(status, codes.unexpectedResponse, msg, { retryAfterSeconds: seconds });
  }
  return new MarconiError(status, e.code, String(e.message ?? ''), {
    instanceURL: typeof e.instance_url === 'string' ? e.instance_url : undefined,
    retryAfterSeconds: seconds,
  });
}

/** The largest Retry-After read as seconds (a day); larger is taken as unreadable. */
const maxRetryAfterSeconds = 86400;

/**
 * Reads a Retry-After header (delay-seconds or an HTTP date) as seconds;
 * undefined when missing, unreadable, or not in the future.
 * @param {string | null} h
 * @param {number} nowMs
 * @returns {number | undefined}
 */
export function parseRetryAfter(h, nowMs) {
  if (h == null || h.trim() === '') return undefined;
  const v = h.trim();
  if (/^-?\d+$/.test(v)) {
    const n = Number(v);
    return n > 0 && n <= maxRetryAfterSeconds ? n : undefined;
  }
  const at = Date.parse(v);
  if (!/[a-z]/i.test(v) || Number.isNaN(at) || at <= nowMs) return undefined;
  return (at - nowMs) / 1000;
}

/**
 * Thrown (as the reason of the 'fatal' event and onFatal) when a newer
 * connection of the session replaced the client's (close 4409): another
 * process resumed the session or took it over. The client does not fight it.
 */
export class ReplacedError extends Error {
  constructor() {
    super('marconi: session taken by a newer connection (4409); not reconnecting');
    this.name = 'ReplacedError';
    /** @type {'replaced'} A stable code, as a MarconiError's. */
    this.code = 'replaced';
  }
}

/**
 * Reports whether err is an answer that retrying cannot change: a bad
 * request, a credential refused, a session that belongs to someone else.
 * @param {unknown} err
 */
export function permanent(err) {
  return err instanceof MarconiError && [400, 401, 403, 404].includes(err.status);
}
