// Sending to the instance that holds the recipient's queue: the hub's hint
// (recipient_instance_url in a send's answer), remembered per recipient, as
// the Go client's holders (bootstrap-client/holder.go).

import { codes } from './codes.js';
import { MarconiError } from './errors.js';
import { TransportError } from './http.js';

/**
 * The holder URLs of a client: per recipient session id, the URL of the
 * instance the hub last named as holding its queue; and the holder URLs that
 * could not be reached lately, left alone until a time. Both maps are
 * bounded by max: past it the entry learned first goes.
 */
export class Holders {
  #max;
  #retryAfterMs;
  #now;
  /** @type {string[]} the client's own hub URLs (trimmed) */
  #hubs;
  /** @type {Map<string, string>} recipient session id → holder URL */
  #hints = new Map();
  /** @type {Map<string, number>} holder URL → until when (ms) it is left alone */
  #bad = new Map();
  /**
   * @type {Map<string, string>} what usable said of the hints seen lately:
   * most answers name one of a few instances, which need not be parsed again
   */
  #checked = new Map();

  /**
   * @param {number} max bound on each map, at least 1
   * @param {number} retryAfterMs how long an unreachable holder URL is left alone
   * @param {string[]} hubs the client's hub URLs, without trailing slashes
   * @param {() => number} [now] the clock, in ms
   */
  constructor(max, retryAfterMs, hubs, now = Date.now) {
    this.#max = max;
    this.#retryAfterMs = retryAfterMs;
    this.#hubs = hubs;
    this.#now = now;
  }

  /** How many recipients have a hint (for tests). */
  get size() {
    return this.#hints.size;
  }

  /**
   * The holder URL to send to's next signal to, or '' for the hub URL: none
   * hinted, or the hinted one could not be reached lately (the hint goes).
   * @param {string} to
   */
  route(to) {
    const u = this.#hints.get(to);
    if (u === undefined) return '';
    const until = this.#bad.get(u);
    if (until !== undefined) {
      if (this.#now() < until) {
        this.#hints.delete(to);
        return '';
      }
      this.#bad.delete(u);
    }
    return u;
  }

  /**
   * Records the hint of a send's answer to to: hint when it is usable, else
   * none (the last one is forgotten).
   * @param {string} to
   * @param {unknown} hint the answer's recipient_instance_url
   */
  learn(to, hint) {
    let u = typeof hint === 'string' ? this.#checked.get(hint) : '';
    if (u === undefined) {
      u = this.usable(hint);
      if (this.#checked.size >= this.#max) this.#checked.clear();
      this.#checked.set(/** @type {string} */ (hint), u);
    }
    this.#hints.delete(to); // a learned hint goes to the back: the first learned leaves first
    if (u === '') return;
    if (this.#hints.size >= this.#max) {
      const first = this.#hints.keys().next();
      if (!first.done) this.#hints.delete(first.value);
    }
    this.#hints.set(to, u);
  }

  /**
   * Drops to's hint.
   * @param {string} to
   */
  forget(to) {
    this.#hints.delete(to);
  }

  /**
   * Drops to's hint and leaves holder alone for retryAfterMs, so that a dead
   * holder costs one failed dial, not one per send.
   * @param {string} to
   * @param {string} holder
   */
  unreachable(to, holder) {
    this.#hints.delete(to);
    const now = this.#now();
    this.#bad.delete(holder);
    if (this.#bad.size >= this.#max) {
      for (const [k, until] of this.#bad) if (now >= until) this.#bad.delete(k); // the expired go
      for (const k of this.#bad.keys()) {
        if (this.#bad.size < this.#max) break;
        this.#bad.delete(k); // then the first marked
      }
    }
    this.#bad.set(holder, now + this.#retryAfterMs);
  }

  /**
   * The hint without its trailing slashes when the client may send its
   * session token there (tokenURL) and it is not one of the client's own hub
   * URLs (those need no route); '' otherwise.
   * @param {unknown} hint
   */
  usable(hint) {
    const s = tokenURL(this.#hubs, hint);
    return this.#hubs.includes(s) ? '' : s;
  }
}

/**
 * raw without its trailing slashes when a client whose hub URLs are hubs may
 * send its session token there, as to a holder hint or a 409
 * wrong_instance's instance_url: an http(s) URL with a host, no
 * credentials, query or fragment, not plain http when the client reaches a
 * hub over https, and not a loopback host unless the client reaches a hub on
 * loopback too. '' otherwise. (An instance without MARCONI_PUBLIC_URL
 * publishes http://127.0.0.1:PORT, which names it only for a client on its
 * machine; a client reaching its hub by another name would send its token to
 * whatever listens on that port where the client runs.)
 * @param {string[]} hubs the client's hub URLs, without trailing slashes
 * @param {unknown} raw
 * @returns {string}
 */
export function tokenURL(hubs, raw) {
  if (typeof raw !== 'string' || raw === '' || /\s/.test(raw)) return '';
  let u;
  try {
    u = new URL(raw);
  } catch {
    return '';
  }
  if ((u.protocol !== 'http:' && u.protocol !== 'https:') || u.host === '' || u.username !== '' ||
      u.password !== '' || raw.includes('?') || raw.includes('#')) {
    return '';
  }
  if (u.protocol === 'http:' && hubs.some((h) => h.startsWith('https:'))) return '';
  if (isLoopback(u.hostname) && !hubs.some((h) => URL.canParse(h) && isLoopback(new URL(h).hostname))) return '';
  return raw.replace(/\/+$/, '');
}

/**
 * Reports whether a URL's hostname names this machine: localhost (or a name
 * under .localhost), a loopback address, or the unspecified one (0.0.0.0,
 * ::), which a connect also takes to this machine.
 * @param {string} hostname as URL.hostname gives it (IPv6 in brackets)
 */
function isLoopback(hostname) {
  const h = hostname.toLowerCase().replace(/\.$/, '').replace(/^\[|\]$/g, '');
  if (h === 'localhost' || h.endsWith('.localhost')) return true;
  if (/^127\.\d+\.\d+\.\d+$/.test(h) || h === '0.0.0.0') return true;
  return h === '::1' || h === '::' || h === '::ffff:127.0.0.1' || /^::ffff:7f/.test(h);
}

/**
 * System error codes of a connection that was never made: refused, no
 * route, no such host, the connect timed out. The request never left.
 */
const neverConnected = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL', 'ENOTFOUND', 'EAI_AGAIN', 'UND_ERR_CONNECT_TIMEOUT']);

/**
 * Reports whether err certainly means the request never reached a hub: the
 * connection could not be made (refused, no route, no such host), or a
 * balancer answered 502 or 503 in a shape that is not the hub's own error
 * (HAProxy's "no server available"). Anything else may have been stored.
 * @param {unknown} err
 */
export function notProcessed(err) {
  if (err instanceof MarconiError) {
    return err.code === codes.unexpectedResponse && (err.status === 502 || err.status === 503);
  }
  if (!(err instanceof TransportError)) return false;
  // TransportError ← fetch's TypeError ← the socket's error (an
  // AggregateError when every address of the host was tried).
  for (let e = /** @type {any} */ (err).cause, depth = 0; e && depth < 4; e = e.cause, depth++) {
    if (neverConnected.has(e.code) || (e.syscall === 'connect' && typeof e.code === 'string')) {
      if (!Array.isArray(e.errors) || e.errors.every((/** @type {any} */ x) => neverConnected.has(x?.code) || x?.syscall === 'connect')) return true;
    }
  }
  return false;
}
