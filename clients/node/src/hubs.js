// The hub URLs: one call on the URL in use, and failover to the next.

import { projectHeader } from './codes.js';
import { ClientClosedError, MarconiError } from './errors.js';
import { TransportError, call } from './http.js';

/**
 * The hub URLs of a client and the one in use. Every call goes to the URL in
 * use; one that gives no answer, or 502, 503 or 504, moves the client to the
 * next URL, round the list.
 */
export class Hubs {
  /** @type {string[]} */
  #urls;
  #index = 0;
  #bounds;
  #onFailover;
  /** @type {Record<string, string>} the session's project header, once registered */
  #project = {};

  /**
   * @param {string[]} urls checked, at least one
   * @param {{close: AbortSignal, timeoutMs: number, onFailover: (from: string, to: string, err: unknown) => void}} o
   *   close ends every call at the client's close; timeoutMs bounds each call
   */
  constructor(urls, o) {
    this.#urls = urls;
    this.#bounds = { close: o.close, timeoutMs: o.timeoutMs };
    this.#onFailover = o.onFailover;
  }

  /** How many URLs there are. */
  get count() {
    return this.#urls.length;
  }

  /**
   * Sets the project every later call names (projectHeader), from the
   * session's registration; '' names none.
   * @param {string} route projectRoute's value
   */
  setProject(route) {
    this.#project = route ? { [projectHeader]: route } : {};
  }

  /** The headers every call for the session carries (the project, once registered). */
  get sessionHeaders() {
    return this.#project;
  }

  /** The URL in use. */
  get base() {
    return this.#urls[this.#index];
  }

  /**
   * Moves to the next URL when base, the one in use, gave no answer (unless
   * another call moved already).
   * @param {string} base
   * @param {unknown} err
   */
  failover(base, err) {
    if (this.#urls.length < 2 || this.base !== base) return;
    this.#index = (this.#index + 1) % this.#urls.length;
    this.#onFailover(base, this.base, err);
  }

  /**
   * One call on the URL in use; rejects with ClientClosedError once the
   * client closes.
   * @param {string} method
   * @param {string} path
   * @param {string} bearer
   * @param {import('./http.js').CallOptions} opts
   */
  async call(method, path, bearer, opts) {
    const base = this.base;
    try {
      return await call(base + path, method, bearer, this.#withProject(opts), this.#bounds);
    } catch (err) {
      if (this.#bounds.close.aborted) throw new ClientClosedError();
      if (unavailable(err)) this.failover(base, err);
      throw err;
    }
  }

  /**
   * One call on base, a URL the hub named (not one of the hub URLs): no
   * failover, whatever the answer; rejects with ClientClosedError once the
   * client closes.
   * @param {string} base
   * @param {string} method
   * @param {string} path
   * @param {string} bearer
   * @param {import('./http.js').CallOptions} opts
   */
  async callAt(base, method, path, bearer, opts) {
    try {
      return await call(base + path, method, bearer, this.#withProject(opts), this.#bounds);
    } catch (err) {
      if (this.#bounds.close.aborted) throw new ClientClosedError();
      throw err;
    }
  }

  /**
   * @param {import('./http.js').CallOptions} opts
   * @returns {import('./http.js').CallOptions}
   */
  #withProject(opts) {
    if (!this.#project[projectHeader]) return opts;
    return { ...opts, headers: { ...this.#project, ...opts.headers } };
  }
}

/**
 * Reports whether err says the hub URL in use could not answer: no answer at
 * all (the connection failed, so an answer, if any, is lost), or 502, 503 or
 * 504. Another instance, or the same one a little later, may answer: a send
 * is made again (same idempotency key) and the next call uses the next URL.
 * @param {unknown} err
 */
export function unavailable(err) {
  if (err instanceof TransportError) return true;
  return err instanceof MarconiError && [502, 503, 504].includes(err.status);
}
