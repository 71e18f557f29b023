// Opening the session's WebSocket: handshake, the hub's refusal, the welcome.

import WebSocket from './ws.js';

/** @typedef {import('ws').default} WebSocket the type of ws's sockets (./ws.js exports only the class) */
import { decodeError } from './errors.js';
import { TransportError } from './http.js';

/** Bounds one WebSocket message from the hub (a signal may carry a large payload). */
export const readLimitBytes = 4 << 20;

/** The WebSocket's normal closure (RFC 6455), with which the client closes its own. */
export const normalClosure = 1000;

/**
 * @typedef {object} Welcome
 * @property {string} session_id
 * @property {string} instance_id
 * @property {boolean} resumed
 * @property {boolean} affinity_reset
 * @property {number} replayed
 * @property {number} [dropped]
 * @property {string} [history] the token of the hub's store history the signals come under
 */

/**
 * @typedef {object} Socket an open WebSocket of the session
 * @property {WebSocket} ws
 * @property {Welcome} welcome
 * @property {Promise<{code: number, reason: string}>} ended resolves when the connection is closed, whoever closed it
 */

/**
 * @typedef {object} OpenOptions
 * @property {string} token the session token
 * @property {Record<string, string>} [headers] more request headers (the project, for a balancer)
 * @property {number} timeoutMs bound on the handshake and on the wait for the welcome
 * @property {AbortSignal} signal cancels the attempt
 * @property {(w: Welcome, ws: WebSocket, ended: Socket['ended']) => boolean} onWelcome runs synchronously when the welcome arrives, before any later frame is read; false refuses the connection
 * @property {(data: any) => void} onFrame every frame after the welcome, decoded
 * @property {(msg: string, fields: object) => void} warn
 */

/**
 * Opens url (ws:// or wss://) with the session token and waits for the
 * welcome. A refusal of the hub rejects with its MarconiError (409
 * wrong_instance carries instanceURL), anything else with a TransportError.
 * @param {string} url
 * @param {OpenOptions} o
 * @returns {Promise<Socket>}
 */
export function openSocket(url, o) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, {
      headers: { ...o.headers, authorization: `Bearer ${o.token}` },
      maxPayload: readLimitBytes,
      handshakeTimeout: o.timeoutMs,
    });
    /** @type {(v: {code: number, reason: string}) => void} */
    let setEnded = () => {};
    /** @type {Promise<{code: number, reason: string}>} */
    const ended = new Promise((r) => (setEnded = r));
    let settled = false;
    let welcomed = false;
    /** @param {Error} err */
    const fail = (err) => {
      if (settled) return;
      settled = true;
      finish();
      ws.terminate();
      reject(err);
    };
    const onAbort = () => fail(o.signal.reason instanceof Error ? o.signal.reason : new Error('aborted'));
    const timer = setTimeout(() => fail(new TransportError(`marconi: no welcome from ${url} within ${o.timeoutMs}ms`)), o.timeoutMs);
    const finish = () => {
      clearTimeout(timer);
      o.signal.removeEventListener('abort', onAbort);
    };
    if (o.signal.aborted) {
      onAbort();
      return;
    }
    o.signal.addEventListener('abort', onAbort, { once: true });

    ws.on('unexpected-response', (_req, res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk) => {
        if (body.length < 65536) body += chunk;
      });
      res.on('end', () => {
        const ra = res.headers['retry-after'];
        fail(decodeError(res.statusCode ?? 0, body, typeof ra === 'string' ? ra : null));
      });
      res.on('error', (err) => fail(new TransportError(`marconi: refusal from ${url} cut short: ${err.message}`, err)));
    });
    // Always listened to: an 'error' event without a listener would throw.
    ws.on('error', (err) => {
      if (!settled) fail(new TransportError(`marconi: attach ${url}: ${err.message}`, err));
      else o.warn('marconi: WebSocket error', { err: err.message });
    });
    ws.on('close', (code, reason) => {
      setEnded({ code, reason: reason.toString() });
      fail(new TransportError(`marconi: ${url} closed the WebSocket (${code}) before the welcome`));
    });
    ws.on('message', (data) => {
      let frame;
      try {
        frame = JSON.parse(data.toString());
      } catch {
        if (!welcomed) fail(new TransportError(`marconi: first frame from ${url} is not JSON`));
        else o.warn('marconi: undecodable frame', {});
        return;
      }
      if (welcomed) {
        o.onFrame(frame);
        return;
      }
      if (frame?.type !== 'welcome') {
        fail(new TransportError(`marconi: first frame from ${url} is not a welcome: ${String(data).slice(0, 100)}`));
        return;
      }
      if (settled) return;
      welcomed = true;
      if (!o.onWelcome(frame, ws, ended)) {
        fail(new TransportError('marconi: connection refused after the welcome (client closing)'));
        return;
      }
      settled = true;
      finish();
      resolve({ ws, welcome: frame, ended });
    });
  });
}
