// One JSON call on the hub, bounded in time and in the size of its answer.

import { decodeError } from './errors.js';
import { linked } from './signals.js';

/** Bounds how much of one HTTP answer the client reads (a drain page of 50 signals of 64 KiB fits). */
export const maxAnswerBytes = 16 << 20;

/**
 * The hub could not be reached or did not answer: connection refused or
 * reset, a timeout, an answer cut short. A send that fails this way may or
 * may not have been stored; the client retries it with the same idempotency
 * key.
 */
export class TransportError extends Error {
  /**
   * @param {string} message
   * @param {unknown} [cause]
   */
  constructor(message, cause) {
    super(message, { cause });
    this.name = 'TransportError';
  }
}

/**
 * @typedef {object} CallOptions
 * @property {Record<string, string>} [headers]
 * @property {string} [body] the JSON body, already encoded
 * @property {AbortSignal} [signal] the caller's cancellation
 */

/**
 * Performs one call. A non-2xx answer is thrown as MarconiError; no answer at
 * all as TransportError; a cancellation by signal as its reason.
 * @param {string} url
 * @param {string} method
 * @param {string} bearer
 * @param {CallOptions} opts
 * @param {{close?: AbortSignal, timeoutMs: number}} bounds the client's own bounds
 * @returns {Promise<{status: number, data: any}>}
 */
export async function call(url, method, bearer, opts, bounds) {
  /** @type {Record<string, string>} */
  const headers = { ...opts.headers, authorization: `Bearer ${bearer}` };
  if (opts.body !== undefined) headers['content-type'] = 'application/json';
  const { signal, done } = linked([bounds.close, opts.signal], bounds.timeoutMs);
  let res;
  let text;
  try {
    res = await fetch(url, { method, headers, body: opts.body, signal });
    text = await readBounded(res);
  } catch (err) {
    if (opts.signal?.aborted) throw opts.signal.reason;
    throw new TransportError(`marconi: ${method} ${url}: ${describe(err)}`, err);
  } finally {
    done();
  }
  if (!res.ok) throw decodeError(res.status, text, res.headers.get('retry-after'));
  if (text === '') return { status: res.status, data: undefined };
  try {
    return { status: res.status, data: JSON.parse(text) };
  } catch (err) {
    throw new TransportError(`marconi: ${method} ${url}: undecodable answer: ${describe(err)}`, err);
  }
}

/** @param {Response} res */
async function readBounded(res) {
  if (!res.body) return '';
  const chunks = [];
  let size = 0;
  for await (const chunk of res.body) {
    size += chunk.byteLength;
    if (size > maxAnswerBytes) throw new Error(`answer larger than ${maxAnswerBytes} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString('utf8');
}

/** @param {unknown} err */
function describe(err) {
  if (!(err instanceof Error)) return String(err);
  const cause = err.cause instanceof Error ? `: ${err.cause.message}` : '';
  return err.message + cause;
}
