// The Marconi client: one registered, attached session.

import { randomBytes } from 'node:crypto';
import { EventEmitter, setMaxListeners } from 'node:events';
import { newIdempotencyKey } from './keys.js';
import WebSocket from './ws.js';

/** @typedef {import('ws').default} WebSocket the type of ws's sockets (./ws.js exports only the class) */
import { Backoff } from './backoff.js';
import { closeCodes, codes, projectHeader, projectRoute } from './codes.js';
import { settle } from './config.js';
import { Dispatcher, toSignal } from './delivery.js';
import { ClientClosedError, MarconiError, ReplacedError, permanent } from './errors.js';
import { TransportError } from './http.js';
import { Holders, notProcessed, tokenURL } from './holders.js';
import { Hubs, unavailable } from './hubs.js';
import { keepalive } from './keepalive.js';
import { linked } from './signals.js';
import { normalClosure, openSocket } from './socket.js';
import { tokenStoreOf } from './tokens.js';

export { defaults } from './config.js';

const defaultHeartbeatMs = 20000;
const welcomeTimeoutMs = 15000;
// How many 409 wrong_instance redirects one attach follows.
const maxWrongInstanceHops = 3;
const drainLimit = 50;
// How often one session call is made when the token keeps changing under it.
const maxCallAttempts = 3;
// Bound on sending, at close(), the ack that ackIntervalMs holds back.
const flushAckMs = 2000;
// The hub no longer had the session (its TTL passed, it was deregistered, or a
// hub on the in-memory store restarted) and the id was registered anew: the
// signals the old session held are not delivered. As the Go client's.
const sessionGone = 'marconi: the hub no longer has the session (expired, deregistered, or a hub on the in-memory store restarted); registered the id again, and what the old session held is not delivered';
const keptSessionGone = 'marconi: the kept token\'s session is gone (expired, deregistered, or a hub on the in-memory store restarted); registered the id anew, and what was sent to the old session is not delivered';
// The warning of a kept tenant or project that cannot be named to the
// balancer: not a string (dropped at load), or not an id of the contract.
const keptProjectUnusable = 'marconi: the kept token\'s tenant or project is not an id of the contract; resuming without naming the project to the balancer until the hub answers';
// Bound on the close handshake at close(): past it the socket is cut.
const closeHandshakeMs = 1000;

const noop = () => {};

/**
 * @typedef {import('../index.js').Config} Config
 * @typedef {import('../index.js').SendResult} SendResult
 * @typedef {import('../index.js').SendOptions} SendOptions
 * @typedef {import('../index.js').Stats} Stats
 * @typedef {import('./socket.js').Socket} Socket
 * @typedef {import('./socket.js').Welcome} Welcome
 * @typedef {{token: string, epoch: number, gen: number}} Auth
 * @typedef {Socket & {gen: number, token: string, history: string}} Conn
 *   history: the token of the hub's store history its signals come under (the welcome's, or a history frame's since)
 */

const start = Symbol('start');

/**
 * Registers the session (a new one, or the one named by config.sessionID),
 * attaches its WebSocket and starts the heartbeat, read and delivery loops.
 * Resolves once the hub has welcomed the connection; rejects with the error
 * that stopped it (a MarconiError when the hub answered one).
 * @param {Config} config
 * @param {{signal?: AbortSignal}} [options] signal bounds only the dial
 * @returns {Promise<Client>}
 */
export async function dial(config, options = {}) {
  const c = new Client(config);
  try {
    await c[start](options.signal);
  } catch (err) {
    await c.close();
    throw err;
  }
  return c;
}

/**
 * One registered, attached session. Use dial to make one. send, stats and
 * sessionID may be used at any time; close (or deregister) once stops it.
 * It emits 'fatal' (with the error) once when it stops for good while
 * running; never 'error', whose emission without a listener would throw.
 */
export class Client extends EventEmitter {
  /** @type {import('./config.js').Settled} */
  #cfg;
  /** @type {Hubs} */
  #hubs;
  /** @type {string[]} the hub URLs, without trailing slashes */
  #hubURLs;
  /** @type {Holders | null} routes sends to the recipient's instance; null with noHolderRouting */
  #holders = null;
  /** @type {Required<import('../index.js').Logger>} */
  #log;
  #backoff;
  #closing = new AbortController();
  /** @type {Promise<void> | null} */
  #closed = null;
  /** @type {Promise<unknown>[]} */
  #loops = [];

  #sessionID;
  #token = '';
  #epoch = 0; // registration count: a new registration starts seq afresh
  #heartbeatMs = defaultHeartbeatMs;
  /** @type {Conn | null} */
  #conn = null;
  #gen = 0; // connection generation, +1 per successful attach
  #healFor = 0; // generation for which a self-heal reconnect was requested
  #immediate = false; // the next redial skips the backoff wait
  #stopped = false; // the supervisor gave up: replaced (4409) or refused by the hub
  #ending = false; // deregister is under way: the session is being ended on purpose
  /** @type {Promise<void>} serializes (re)registrations */
  #registering = Promise.resolve();
  /** the Idempotency-Key of the registration under way, kept by its retries; '' once answered */
  #regKey = '';
  /** @type {(() => void) | null} cuts the supervisor's backoff wait short */
  #wakeSupervisor = null;

  /** @type {Dispatcher} */
  #delivery;
  /** @type {import('../index.js').TokenStore | null} keeps the token across restarts */
  #tokens;
  /** the token loaded at dial, for the first registration to resume with */
  #keptToken = '';
  /** the tenant and project the hub named at the last registration, kept with the token */
  #tenantID = '';
  #projectID = '';
  #fatal = false; // 'fatal' was told

  #stats = { reconnects: 0, selfHealReconnects: 0, reregistrations: 0, droppedAtReset: 0, sendRetries: 0, failovers: 0, pingTimeouts: 0, takeovers: 0, rateLimited: 0, holderSends: 0, holderFallbacks: 0, acks: 0 };

  /** @param {Config} config */
  constructor(config) {
    super();
    const { cfg, urls, log } = settle(config);
    this.#tokens = tokenStoreOf(config);
    this.#cfg = cfg;
    this.#log = log;
    this.#backoff = new Backoff(cfg.reconnectBaseDelayMs, cfg.reconnectMaxDelayMs);
    this.#sessionID = config.sessionID ?? '';
    // Every call in flight listens to the close signal (and unlinks when done).
    setMaxListeners(0, this.#closing.signal);
    this.#hubURLs = urls;
    this.#hubs = new Hubs(urls, {
      close: this.#closing.signal,
      timeoutMs: cfg.requestTimeoutMs,
      onFailover: (from, to, err) => {
        this.#stats.failovers++;
        this.#log.warn('marconi: hub URL unreachable; failing over', { from, to, err: String(err) });
      },
    });
    if (!cfg.noHolderRouting) this.#holders = new Holders(cfg.holderHints, cfg.holderRetryAfterMs, urls);
    this.#delivery = new Dispatcher({
      closing: this.#closing.signal,
      handlers: cfg,
      ack: (epoch, upTo, history) => this.#ack(epoch, upTo, history),
      onRoom: () => this.#conn?.ws.resume(),
      ackIntervalMs: cfg.ackIntervalMs,
      log,
    });
  }

  /** The session's id, as the hub registered it. */
  get sessionID() {
    return this.#sessionID;
  }

  /**
   * What the client has done so far to keep its route.
   * @returns {Stats}
   */
  stats() {
    return { ...this.#stats };
  }

  /**
   * Closes the WebSocket normally (1000) and stops every loop the client
   * started, waiting for them (and for a running onSignal). The session stays
   * registered until its TTL runs out. Idempotent.
   * @returns {Promise<void>}
   */
  close() {
    this.#closed ??= this.#shutdown();
    return this.#closed;
  }

  async #shutdown() {
    // The ack that ackIntervalMs holds back goes first, within flushAckMs.
    let flushed;
    await Promise.race([this.#delivery.flush(), new Promise((r) => (flushed = setTimeout(r, flushAckMs)))]);
    clearTimeout(flushed);
    this.#closing.abort(new ClientClosedError());
    this.#delivery.wake();
    this.#wakeSupervisor?.();
    const conn = this.#conn;
    if (conn) {
      conn.ws.close(normalClosure, 'client closed');
      const cut = setTimeout(() => conn.ws.terminate(), closeHandshakeMs);
      await conn.ended;
      clearTimeout(cut);
    }
    await Promise.allSettled(this.#loops);
  }

  /**
   * Ends the session on the hub (DELETE /v1/session), so it stops counting as
   * live at once rather than when its TTL runs out, then closes the client as
   * close does. Signals not yet acknowledged are gone with the session. A
   * session the hub no longer knows counts as ended. On any other error the
   * client keeps running; deregister may be called again, or close.
   * @param {{signal?: AbortSignal}} [options]
   * @returns {Promise<void>}
   */
  async deregister(options = {}) {
    if (this.#closed) throw new ClientClosedError();
    this.#ending = true; // the 4410 close that follows is no reason to register again
    try {
      for (let attempt = 1; ; attempt++) {
        const token = this.#token;
        try {
          await this.#hubs.call('DELETE', '/v1/session', token, { signal: options.signal });
          break;
        } catch (err) {
          if (err instanceof MarconiError && err.code === codes.sessionExpired) break; // gone already
          if (attempt < maxCallAttempts && err instanceof MarconiError && err.status === 401) {
            await this.#registering; // a resume in flight may have rotated the token
            if (this.#token !== token) continue;
          }
          throw err;
        }
      }
    } catch (err) {
      this.#ending = false;
      throw err;
    }
    this.#log.info('marconi: session deregistered', { session_id: this.#sessionID });
    await this.close();
  }

  /**
   * Sends a signal to the session `to`. kind may be empty (the hub's default,
   * "signal"); payload is encoded as JSON. Resolves with the hub's answer;
   * signals waiting for this session that came with it (piggyback) go to
   * onSignal. When the hub says sender_route_stale, the reconnect has started
   * when it resolves. A send that got no answer, or a 502, 503 or 504, is
   * made again with the same idempotency key, up to sendAttempts times.
   * When an earlier answer named the instance holding to's queue, the send
   * goes there (#sendCall).
   * @param {string} to
   * @param {string} kind
   * @param {unknown} payload
   * @param {SendOptions} [options]
   * @returns {Promise<SendResult>}
   */
  async send(to, kind, payload, options = {}) {
    if (this.#closed) throw new ClientClosedError();
    const key = options.idempotencyKey ?? newIdempotencyKey();
    /** @type {Record<string, unknown>} */
    const req = { to_session: to, payload: payload === undefined ? null : payload, idempotency_key: key };
    if (kind) req.kind = kind;
    const body = JSON.stringify(req);
    const limit = { waits: 0, spentMs: 0 };
    for (let attempt = 0; ; attempt++) {
      try {
        const { auth, data } = await this.#sendCall(to, body, options.signal);
        return this.#sent(to, key, auth, data);
      } catch (err) {
        if (await this.#waitRateLimit(err, limit, options.signal)) {
          attempt--; // a 429 is no lost answer: it spends none of sendAttempts
          continue;
        }
        if (!unavailable(err) || attempt + 1 >= this.#cfg.sendAttempts || this.#closed || options.signal?.aborted) throw err;
        this.#stats.sendRetries++;
        this.#log.warn('marconi: send got no usable answer; retrying with the same idempotency key', {
          to_session: to, idempotency_key: key, attempt, err: String(err),
        });
        await this.#sleep(this.#backoff.delay(attempt), options.signal);
      }
    }
  }

  /**
   * Makes one send: to the instance the hub last named as holding to's queue
   * when there is one, else (and when that instance certainly did not get
   * it: the connection could not be made, or a balancer answered 502/503
   * itself) through the hub URL. Learns the answer's hint. Any other failure
   * at the holder is thrown (the send loop may retry it, with the same key,
   * through the hub URL): it may have been stored.
   * @param {string} to
   * @param {string} body
   * @param {AbortSignal} [signal]
   * @returns {Promise<{auth: Auth, data: any}>}
   */
  async #sendCall(to, body, signal) {
    const opts = { body, signal };
    const holders = this.#holders;
    const holder = holders?.route(to) ?? '';
    if (holders && holder) {
      try {
        const r = await this.#sessionCall('POST', '/v1/signals', opts, holder);
        this.#stats.holderSends++;
        holders.learn(to, r.data?.recipient_instance_url);
        return r;
      } catch (err) {
        if (!notProcessed(err) || signal?.aborted || this.#closing.signal.aborted) {
          holders.forget(to);
          throw err;
        }
        holders.unreachable(to, holder);
        this.#stats.holderFallbacks++;
        this.#log.info('marconi: the recipient\'s instance is unreachable; sending through the hub URL', {
          to_session: to, instance_url: holder, retry_after_ms: this.#cfg.holderRetryAfterMs, err: String(err),
        });
      }
    }
    const r = await this.#sessionCall('POST', '/v1/signals', opts);
    holders?.learn(to, r.data?.recipient_instance_url);
    return r;
  }

  /**
   * @param {string} to
   * @param {string} key
   * @param {Auth} auth
   * @param {any} data
   * @returns {SendResult}
   */
  #sent(to, key, auth, data) {
    /** @type {SendResult} */
    const res = {
      signalID: data.signal_id,
      seq: data.seq,
      delivery: data.delivery,
      recipientRouteState: data.recipient_route_state,
      selfhealOutcome: data.selfheal_outcome ?? null,
      recipientRouteStale: data.recipient_route_stale === true,
      senderRouteStale: data.sender_route_stale === true,
      duplicate: data.duplicate === true,
      idempotencyKey: key,
    };
    if (Array.isArray(data.pending) && data.pending.length > 0) {
      this.#delivery.offer(pendingPage(data, auth.epoch));
    }
    if (res.recipientRouteStale) {
      this.#log.info('marconi: recipient route stale; it repairs on its own next send', {
        to_session: to, signal_id: res.signalID, selfheal_outcome: res.selfhealOutcome,
      });
    }
    if (res.senderRouteStale) this.#requestSelfHeal(auth.gen);
    return res;
  }

  // ---- start, connect, attach ----

  /** @param {AbortSignal | undefined} signal */
  async [start](signal) {
    await this.#loadToken();
    this.#loops.push(this.#delivery.run());
    let conn;
    // With several hub URLs, each is tried once, in order, while they are unavailable.
    for (let i = 0; ; i++) {
      try {
        conn = await this.#connect(signal);
        break;
      } catch (err) {
        if (i + 1 >= this.#hubs.count || !unavailable(err) || signal?.aborted) throw err;
      }
    }
    this.#loops.push(this.#supervise(conn), this.#heartbeatLoop());
  }

  /**
   * The bootstrap connect sequence: attach with the session's token and wait
   * for the welcome; when the hub no longer knows the session (410), register
   * it again and attach. A reconnect does not resume (rotate the token)
   * first: a resume whose answer is lost leaves the client holding a token
   * the hub has replaced, refused (403) from then on. The token stays valid
   * until the client itself rotates it, so attaching with it is enough.
   * @param {AbortSignal} [signal]
   * @returns {Promise<Conn>}
   */
  async #connect(signal) {
    if (this.#epoch === 0) await this.#register(signal); // dial: not registered yet
    const a = this.#auth();
    try {
      return await this.#attach(signal);
    } catch (err) {
      if (!(err instanceof MarconiError && err.code === codes.sessionExpired)) throw err;
      await this.#reregister(a.token, signal);
      return this.#attach(signal);
    }
  }

  /**
   * Opens GET /v1/ws with the session token, following 409 wrong_instance to
   * the instance that holds the session. Every attach starts at the current
   * hub URL: a followed instance_url is not pinned, so when that instance dies
   * the next attempt asks the hub URL again, whose instance takes the session
   * over once it sees the dead one's heartbeat age out.
   * @param {AbortSignal} [signal]
   * @returns {Promise<Conn>}
   */
  async #attach(signal) {
    let base = this.#hubs.base;
    for (let hop = 0; ; hop++) {
      const a = this.#auth();
      /** @type {{conn: Conn | null}} */
      const got = { conn: null };
      const stop = linked([signal, this.#closing.signal]);
      try {
        await openSocket(`${base.replace(/^http/, 'ws')}/v1/ws`, {
          token: a.token,
          headers: this.#hubs.sessionHeaders,
          timeoutMs: welcomeTimeoutMs,
          signal: stop.signal,
          onWelcome: (w, ws, ended) => (got.conn = this.#welcomed(w, ws, ended, a)) !== null,
          onFrame: (f) => this.#frame(f, a.epoch),
          warn: this.#log.warn,
        });
        if (!got.conn) throw new ClientClosedError();
        return got.conn;
      } catch (err) {
        if (err instanceof MarconiError && err.code === codes.wrongInstance && err.instanceURL && hop < maxWrongInstanceHops) {
          const target = tokenURL(this.#hubURLs, err.instanceURL);
          if (target === '') {
            // The session token must not go there: plain http from an https
            // hub, a loopback address from a remote one.
            this.#log.warn('marconi: not following wrong_instance to an instance_url the session token may not go to (publish https:// instance URLs on an https fleet: docs/operations.md)', { instance_url: err.instanceURL });
            throw err;
          }
          this.#log.debug('marconi: following wrong_instance', { instance_url: err.instanceURL });
          base = target;
          continue;
        }
        if (hop === 0 && unavailable(err)) {
          this.#hubs.failover(base, err);
        } else if (err instanceof TransportError) {
          // Most likely the followed instance died and the hub URL's instance
          // has not yet seen it gone: every attempt starts at the hub URL
          // again, which takes the session over once it has.
          this.#log.warn('marconi: assigned instance unreachable; retrying through the hub URL', { instance_url: base, err: err.message });
        }
        throw err;
      } finally {
        stop.done();
      }
    }
  }

  /**
   * Adopts a welcomed connection as the current one. Runs synchronously when
   * the welcome arrives, so the affinity reset is queued before any replayed
   * signal.
   * @param {Welcome} w
   * @param {WebSocket} ws
   * @param {Socket['ended']} ended
   * @param {Auth} a
   * @returns {Conn | null} null when the client is closing
   */
  #welcomed(w, ws, ended, a) {
    if (this.#closing.signal.aborted) return null;
    this.#gen++;
    const conn = { ws, welcome: w, ended, gen: this.#gen, token: a.token, history: w.history ?? '' };
    this.#conn = conn;
    this.#immediate = false;
    this.#log.info('marconi: attached', {
      session_id: w.session_id, instance_id: w.instance_id, resumed: w.resumed,
      affinity_reset: w.affinity_reset, replayed: w.replayed, generation: this.#gen,
    });
    const dropped = w.dropped ?? 0;
    if (dropped > 0) {
      this.#stats.droppedAtReset += dropped;
      this.#log.warn('marconi: the hub dropped pending signals at the affinity reset (disconnect policy drop)', {
        session_id: w.session_id, instance_id: w.instance_id, dropped,
      });
    }
    if (w.affinity_reset) this.#delivery.enqueue({ signals: [], epoch: a.epoch, reset: { reason: 'affinity_reset', dropped } });
    if (this.#cfg.pingIntervalMs > 0) {
      keepalive(ws, {
        intervalMs: this.#cfg.pingIntervalMs,
        timeoutMs: this.#cfg.pingTimeoutMs,
        onDead: () => this.#pingTimedOut(conn),
        debug: this.#log.debug,
      });
    }
    return conn;
  }

  /**
   * The hub left a ping of conn unanswered: the path died silently. The
   * socket is cut (no close handshake: nothing comes back on this path) and
   * the supervisor redials with the usual backoff.
   * @param {Conn} conn
   */
  #pingTimedOut(conn) {
    if (this.#closing.signal.aborted) return;
    this.#stats.pingTimeouts++;
    this.#log.warn('marconi: no pong from the hub within pingTimeoutMs; the path is dead, reconnecting', {
      session_id: this.#sessionID, generation: conn.gen, ping_timeout_ms: this.#cfg.pingTimeoutMs,
    });
    conn.ws.terminate();
  }

  /**
   * @param {any} f
   * @param {number} epoch
   */
  #frame(f, epoch) {
    if (f?.type === 'history' && this.#conn && typeof f.history === 'string') {
      // The hub writes the unacknowledged signals again under it.
      this.#log.info("marconi: the hub's store moved to another history (a standby promoted); its unacknowledged signals come again", { history: f.history });
      this.#conn.history = f.history;
      return;
    }
    if (f?.type !== 'signal') {
      this.#log.debug('marconi: ignoring frame', { type: f?.type });
      return;
    }
    this.#delivery.enqueue({ signals: [toSignal(f)], epoch, history: this.#conn?.history ?? '' });
    // Backpressure: past the queue's bound the socket stops being read; the
    // hub keeps the signals (a queue of its that fills closes with 4429).
    if (this.#delivery.full) this.#conn?.ws.pause();
  }

  // ---- supervision: reconnects ----

  /**
   * Owns the WebSocket: when the connection ends, decides whether and how to
   * connect again.
   * @param {Conn} conn
   */
  async #supervise(conn) {
    for (;;) {
      const { code, reason } = await conn.ended;
      if (this.#conn?.gen === conn.gen) this.#conn = null;
      if (this.#closing.signal.aborted || this.#ending) return; // deregister: close follows
      if (!this.#immediate) {
        if (code === closeCodes.replaced) {
          this.#stopped = true;
          this.#log.warn('marconi: connection replaced by a newer one of this session; not redialing', {});
          this.#tellFatal(new ReplacedError());
          return;
        }
        if (code === closeCodes.sessionExpired) {
          await this.#reregister(conn.token).catch((err) => this.#log.warn('marconi: re-register after 4410 failed', { err: String(err) }));
        }
      }
      this.#log.info('marconi: WebSocket ended, reconnecting', { status: code, reason, immediate: this.#immediate });
      const next = await this.#redial(code === closeCodes.restarting);
      if (!('conn' in next)) {
        this.#stopped = true;
        if (next.refused) this.#tellFatal(next.refused);
        return;
      }
      conn = next.conn;
    }
  }

  /**
   * Tells the application, once, that the client stopped for good: onFatal,
   * then the 'fatal' event. A throwing onFatal is logged.
   * @param {MarconiError | ReplacedError} err
   */
  #tellFatal(err) {
    if (this.#fatal || this.#closing.signal.aborted) return;
    this.#fatal = true;
    try {
      this.#cfg.onFatal?.(err);
    } catch (e) {
      this.#log.error('marconi: onFatal threw', { err: String(e) });
    }
    this.emit('fatal', err);
  }

  /**
   * Attaches again, waiting between attempts with backoff and draining while
   * the WebSocket is down, until attached ({conn}), closed ({}), or refused
   * for good ({refused}: the hub's answer). After a restart the hub announced
   * (1012) the backoff's ceiling is reconnectRestartMaxDelayMs. An attach
   * refused 429 waits at least the answer's Retry-After before the next one.
   * @param {boolean} restart
   * @returns {Promise<{conn: Conn} | {refused?: MarconiError}>}
   */
  async #redial(restart) {
    const backoff = restart ? this.#backoff.capped(this.#cfg.reconnectRestartMaxDelayMs) : this.#backoff;
    let askedMs = 0; // the hub's Retry-After on the last attempt's 429
    for (let attempt = 0; ; attempt++) {
      if (!this.#immediate) {
        await this.#drain();
        if (!(await this.#waitOrHeal(Math.max(backoff.delay(attempt), askedMs)))) return {};
      }
      try {
        const conn = await this.#connect();
        this.#stats.reconnects++;
        return { conn };
      } catch (err) {
        if (this.#closing.signal.aborted) return {};
        this.#immediate = false;
        if (permanent(err)) {
          this.#log.error('marconi: hub refuses the session; giving up reconnecting', { err: String(err) });
          return { refused: /** @type {MarconiError} */ (err) };
        }
        // An attach refused 429 (the hub's per-session attach rate) is
        // tried again after its Retry-After, with up to a quarter more of
        // jitter, not at the backoff's pace, which would be refused again.
        askedMs = 0;
        if (err instanceof MarconiError && err.status === 429 && err.retryAfterSeconds !== undefined) {
          askedMs = err.retryAfterSeconds * 1000 * (1 + Math.random() / 4);
          this.#stats.rateLimited++;
        }
        this.#log.warn('marconi: reconnect failed', { attempt, err: String(err), ...(askedMs ? { wait_ms: Math.round(askedMs) } : {}) });
      }
    }
  }

  /**
   * Closes the WebSocket of generation gen and has the supervisor run the
   * connect sequence again, unless that was already done or requested for
   * gen: many sends answered sender_route_stale at once cause one reconnect.
   * @param {number} gen
   */
  #requestSelfHeal(gen) {
    if (this.#closing.signal.aborted || this.#stopped || this.#gen > gen || this.#healFor >= gen) return;
    this.#healFor = gen;
    this.#immediate = true;
    this.#stats.selfHealReconnects++;
    this.#log.info('marconi: sender route stale, reconnecting', { session_id: this.#sessionID, generation: gen });
    // No close handshake: the hub holds no queue for this connection, so
    // there is most likely no peer to answer one.
    if (this.#conn?.gen === gen) this.#conn.ws.terminate();
    this.#wakeSupervisor?.();
  }

  /**
   * Waits ms, cut short by a self-heal request; false when the client closes.
   * @param {number} ms
   */
  #waitOrHeal(ms) {
    return new Promise((resolve) => {
      const done = (/** @type {boolean} */ v) => {
        clearTimeout(t);
        this.#closing.signal.removeEventListener('abort', onAbort);
        this.#wakeSupervisor = null;
        resolve(v);
      };
      const onAbort = () => done(false);
      const t = setTimeout(() => done(true), ms);
      if (this.#closing.signal.aborted) return done(false);
      this.#closing.signal.addEventListener('abort', onAbort, { once: true });
      this.#wakeSupervisor = () => done(!this.#closing.signal.aborted);
    });
  }

  /**
   * Waits out err when it is a 429 whose wait fits in what is left of the
   * call's budget (rateLimitWaitMs, limit.spentMs spent so far): the
   * Retry-After with up to a quarter more of jitter (callers refused the same
   * second come back spread), or the reconnect backoff when the header is
   * missing or unreadable (but not on quota_exceeded, whose missing
   * Retry-After means waiting does not help). Resolves true when waited (make
   * the call again), false when err is to be thrown: not a 429, a wait beyond
   * the budget, or the client closed or signal aborted meanwhile.
   * @param {unknown} err
   * @param {{waits: number, spentMs: number}} limit
   * @param {AbortSignal} [signal]
   */
  async #waitRateLimit(err, limit, signal) {
    if (!(err instanceof MarconiError) || err.status !== 429) return false;
    const left = this.#cfg.rateLimitWaitMs - limit.spentMs;
    let ms;
    // A quota with no Retry-After: the hub says waiting does not help (live sessions per project).
    if (err.retryAfterSeconds === undefined && err.code === codes.quotaExceeded) return false;
    if (err.retryAfterSeconds === undefined) {
      ms = this.#backoff.ceiling(limit.waits) / 2 + this.#backoff.delay(limit.waits) / 2;
    } else {
      ms = err.retryAfterSeconds * 1000;
      if (ms <= left) ms = Math.min(ms + Math.random() * ms / 4, left);
    }
    if (ms > left) return false; // longer than the caller may wait: the 429 is the answer
    limit.waits++;
    limit.spentMs += ms;
    this.#stats.rateLimited++;
    this.#log.info('marconi: hub asks to wait (429); retrying after it', { code: err.code, wait_ms: Math.round(ms), retry_after: err.retryAfterSeconds });
    return this.#sleep(ms, signal);
  }

  /**
   * Sleeps ms unless the client closes or signal aborts.
   * @param {number} ms
   * @param {AbortSignal} [signal]
   */
  #sleep(ms, signal) {
    const stop = linked([signal, this.#closing.signal]);
    return new Promise((resolve) => {
      if (stop.signal.aborted) return resolve(false);
      const t = setTimeout(() => {
        stop.done();
        resolve(true);
      }, ms);
      stop.signal.addEventListener('abort', () => {
        clearTimeout(t);
        stop.done();
        resolve(false);
      }, { once: true });
    });
  }

  // ---- registration ----

  /**
   * Runs fn alone among registrations.
   * @template T
   * @param {() => Promise<T>} fn
   * @returns {Promise<T>}
   */
  async #exclusive(fn) {
    const prev = this.#registering;
    /** @type {() => void} */
    let release = noop;
    this.#registering = new Promise((r) => (release = r));
    await prev;
    try {
      return await fn();
    } finally {
      release();
    }
  }

  /**
   * The client's first registration, at dial: a resume with the token kept
   * in the token store when there is one (X-Marconi-Session-Token), else a
   * registration of the configured id. A kept token of a session the hub no
   * longer knows becomes a registration of the same id (the hub answers the
   * resume 201; an answer 410 is registered again), counted and told as a
   * re-registration; a registration refused because the id is live (403)
   * becomes a takeover when config says takeover. The new token is kept,
   * with the project the hub named, which wins over a kept one.
   * @param {AbortSignal} [signal]
   */
  #register(signal) {
    return this.#exclusive(async () => {
      const id = this.#sessionID;
      const token = this.#keptToken;
      this.#keptToken = '';
      let r;
      try {
        try {
          r = await this.#postRegister(id, token, signal);
        } catch (err) {
          if (!(token && err instanceof MarconiError && err.code === codes.sessionExpired)) throw err;
          r = await this.#postRegister(id, '', signal);
        }
      } catch (err) {
        if (!(this.#cfg.takeover && id && err instanceof MarconiError && err.status === 403)) throw this.#liveHint(err, id);
        this.#log.warn('marconi: session is live under a token this client does not hold; taking it over', { session_id: id });
        this.#regKey = ''; // another registration: the refused one stored nothing
        r = await this.#postRegister(id, '', signal, true);
      }
      const kept = this.#hubs.sessionHeaders[projectHeader];
      this.#adopt(r.data, r.status === 201);
      const now = this.#hubs.sessionHeaders[projectHeader];
      if (kept && now !== kept) {
        this.#log.info('marconi: the hub names another project than the kept token\'s; following the hub\'s', { session_id: r.data.session_id, kept, project: now });
      }
      if (token && r.status === 201) {
        // The kept token named a session the hub no longer has: what was sent
        // to it is gone with it, as after a 410 while running.
        this.#reregistered(r.data.session_id, keptSessionGone);
      }
      if (r.data.taken_over === true) {
        this.#stats.takeovers++;
        this.#log.warn('marconi: session taken over; its former holder\'s token stopped working', { session_id: r.data.session_id });
        // Whatever the session held at runtime belonged to the former holder.
        this.#delivery.enqueue({ signals: [], epoch: this.#epoch, reset: { reason: 'taken_over', dropped: 0 } });
      }
      await this.#keep();
    });
  }

  /**
   * Adds to the hub's refusal of a live id at dial (403) which of the client's
   * settings brings the session back: the hub's message names a header and a
   * JSON field, which an application never sets itself. `hubMessage` stays the
   * hub's; only `message` says more.
   * @param {unknown} err
   * @param {string} id
   */
  #liveHint(err, id) {
    if (!id || this.#cfg.takeover || !(err instanceof MarconiError) || err.code !== codes.forbidden) return err;
    err.message += this.#tokens
      ? ` (another process holds session "${id}", or the kept token is no longer current: stop the other one, or set takeover: true to take the session over)`
      : ` (another process holds session "${id}", or this one kept no token: set tokenFile (or tokenStore) so that a restart resumes the session, or takeover: true to take it over)`;
    return err;
  }

  /** Loads the kept token at dial: one of the configured session (or of any, when none is configured) is resumed with. */
  async #loadToken() {
    if (!this.#tokens) return;
    let t;
    try {
      t = await this.#tokens.load();
    } catch (err) {
      throw new Error(`marconi: load the kept session token: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    if (!t?.token || (this.#cfg.sessionID && t.sessionID !== this.#cfg.sessionID)) return;
    this.#sessionID = t.sessionID;
    this.#keptToken = t.token;
    if (t.dropped) {
      this.#log.warn(keptProjectUnusable, { session_id: t.sessionID, dropped: t.dropped });
      return;
    }
    this.#keptProject(t);
  }

  /**
   * Names the kept token's project (projectHeader) from the resume on, so
   * that a balancer hashing on it sends the restarted agent to its project's
   * instance before the hub has answered. A token kept without a project
   * names none until the answer; one kept with a project that is not a pair
   * of the contract's ids is never sent, and says so.
   * @param {import('../index.js').SessionToken} t
   */
  #keptProject(t) {
    const absent = (/** @type {unknown} */ v) => v === undefined || v === null || v === '';
    if (absent(t.tenantID) && absent(t.projectID)) return;
    const route = projectRoute(t.tenantID, t.projectID);
    if (!route) {
      this.#log.warn(keptProjectUnusable, {
        session_id: t.sessionID, tenant_id: JSON.stringify(t.tenantID)?.slice(0, 66), project_id: JSON.stringify(t.projectID)?.slice(0, 66),
      });
      return;
    }
    this.#hubs.setProject(route);
  }

  /**
   * Saves the current session, its token and the project the hub last named
   * to the token store; runs within #exclusive, so saves keep the order of
   * the tokens.
   */
  async #keep() {
    if (!this.#tokens) return;
    try {
      await this.#tokens.save({ sessionID: this.#sessionID, token: this.#token, tenantID: this.#tenantID, projectID: this.#projectID });
    } catch (err) {
      throw new Error(`marconi: keep the session token: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
  }

  /**
   * Registers the session_id again after the hub answered 410 to a call made
   * with the token stale. Only the first of several concurrent callers
   * registers; the others find the token changed. The WebSocket of the old
   * registration is cut so the supervisor attaches anew right away.
   * @param {string} stale
   * @param {AbortSignal} [signal]
   */
  #reregister(stale, signal) {
    return this.#exclusive(async () => {
      if (this.#token !== stale || this.#ending) return;
      const r = await this.#postRegister(this.#sessionID, '', signal);
      this.#adopt(r.data, r.status === 201);
      this.#reregistered(r.data.session_id);
      await this.#keep().catch((err) => this.#log.error('marconi: could not keep the new session token; a restart will not resume it', { err: String(err) }));
      this.#immediate = true;
      this.#conn?.ws.terminate(); // it belongs to the registration that is gone
    });
  }

  /**
   * @param {string} id
   * @param {string} [msg]
   */
  #reregistered(id, msg = sessionGone) {
    this.#stats.reregistrations++;
    this.#log.warn(msg, { session_id: id });
    this.#delivery.enqueue({ signals: [], epoch: this.#epoch, reset: { reason: 'reregistered', dropped: 0 } });
  }

  /**
   * One registration (a resume when token is set, a takeover when takeover
   * is), retried with one key when its answer is lost; a 429 is waited out.
   * @param {string} id
   * @param {string} token
   * @param {AbortSignal} [signal]
   * @param {boolean} [takeover]
   */
  async #postRegister(id, token, signal, takeover = false) {
    // One key for every attempt of this registration, kept until an answer is
    // adopted: the hub answers a retry of a registration it made (its answer
    // lost) with a new token instead of 403. The key is a secret: never logged.
    if (!this.#regKey) this.#regKey = randomBytes(24).toString('base64url'); // 192 bits; the hub wants 128 or more
    /** @type {Record<string, string>} */
    const headers = { 'idempotency-key': this.#regKey };
    if (token) headers['x-marconi-session-token'] = token;
    /** @type {Record<string, string | boolean>} */
    const req = { surface: this.#cfg.surface };
    if (id) req.session_id = id;
    if (takeover) req.takeover = true;
    if (this.#cfg.runtimeMode) req.runtime_mode = this.#cfg.runtimeMode;
    if (this.#cfg.clientID) req.client_id = this.#cfg.clientID;
    const body = JSON.stringify(req);
    const limit = { waits: 0, spentMs: 0 };
    for (let attempt = 0; ; attempt++) {
      try {
        const r = await this.#hubs.call('POST', '/v1/sessions', this.#cfg.apiKey, { headers, body, signal });
        if (!r.data?.token) throw new TransportError(`marconi: register answered ${r.status} without a token`);
        return r;
      } catch (err) {
        if (await this.#waitRateLimit(err, limit, signal)) {
          attempt--; // a 429 is no lost answer: it spends none of sendAttempts
          continue;
        }
        if (!unavailable(err) || attempt + 1 >= this.#cfg.sendAttempts || this.#closed || signal?.aborted) throw err;
        this.#log.warn('marconi: registration got no usable answer; registering again with the same idempotency key', {
          session_id: id, attempt, err: String(err),
        });
        await this.#sleep(this.#backoff.delay(attempt), signal);
      }
    }
  }

  /**
   * Takes a registration answer as the current session. A new registration
   * starts a new epoch: the hub numbers its signals afresh.
   * @param {any} data
   * @param {boolean} created
   */
  #adopt(data, created) {
    this.#regKey = ''; // answered: the next registration is another one
    this.#sessionID = data.session_id;
    this.#token = data.token;
    this.#tenantID = typeof data.tenant_id === 'string' ? data.tenant_id : '';
    this.#projectID = typeof data.project_id === 'string' ? data.project_id : '';
    const route = projectRoute(data.tenant_id, data.project_id);
    if (route) this.#hubs.setProject(route);
    if (created || this.#epoch === 0) this.#epoch++; // the first registration, a resume included, is epoch 1
    if (data.heartbeat_interval_seconds > 0) this.#heartbeatMs = data.heartbeat_interval_seconds * 1000;
  }

  /** @returns {Auth} */
  #auth() {
    return { token: this.#token, epoch: this.#epoch, gen: this.#gen };
  }

  // ---- HTTP ----

  /**
   * A call with the session token. When the token was rotated meanwhile by a
   * resume (401), or the session is gone (410, after which the same
   * session_id is registered again), the call is made once more. It goes to
   * base, a URL the hub named, when given, else to the hub URL in use (with
   * its failover); a re-registration goes to the hub URL.
   * @param {string} method
   * @param {string} path
   * @param {import('./http.js').CallOptions} [opts]
   * @param {string} [base]
   * @returns {Promise<{auth: Auth, data: any}>}
   */
  async #sessionCall(method, path, opts = {}, base = '') {
    let reregistered = false;
    for (let attempt = 1; ; attempt++) {
      const a = this.#auth();
      try {
        const r = base
          ? await this.#hubs.callAt(base, method, path, a.token, opts)
          : await this.#hubs.call(method, path, a.token, opts);
        return { auth: a, data: r.data };
      } catch (err) {
        if (!(err instanceof MarconiError) || attempt === maxCallAttempts) throw err;
        if (err.status === 401) {
          await this.#registering; // a resume in flight may have rotated the token
          if (this.#token !== a.token) continue;
        }
        if (err.code === codes.sessionExpired && !reregistered) {
          reregistered = true;
          await this.#reregister(a.token);
          continue;
        }
        throw err;
      }
    }
  }

  async #heartbeatLoop() {
    while (await this.#sleep(this.#heartbeatMs)) {
      if (this.#stopped) return; // replaced: the newer connection keeps the session alive; refused: pointless
      try {
        const { auth, data } = await this.#sessionCall('POST', '/v1/heartbeat');
        this.#log.debug('marconi: heartbeat', { route_state: data?.route_state });
        if (Array.isArray(data?.pending) && data.pending.length > 0) {
          this.#delivery.offer(pendingPage(data, auth.epoch));
        }
      } catch (err) {
        if (!this.#closing.signal.aborted) this.#log.warn('marconi: heartbeat failed', { err: String(err) });
      }
    }
  }

  /** Fetches, while the WebSocket is down, what the hub holds beyond the highest signal delivered. */
  async #drain() {
    try {
      // A new registration numbers afresh: its signals all come after 0.
      // The history the seq came under goes with it: under another, the hub
      // answers from the acknowledged seq (history_changed), since a store
      // that failed over may have given the seqs delivered to other signals.
      const after = this.#delivery.drainAfter(this.#epoch);
      const history = after.history ? `&history=${encodeURIComponent(after.history)}` : '';
      const { auth, data } = await this.#sessionCall('GET', `/v1/signals?after_seq=${after.seq}&limit=${drainLimit}${history}`);
      const signals = Array.isArray(data?.signals) ? data.signals.map(toSignal) : [];
      if (signals.length > 0 || data?.history_changed === true) {
        this.#delivery.offer({
          signals, epoch: auth.epoch, history: typeof data?.history === 'string' ? data.history : '',
          page: true, through: typeof data?.next_after_seq === 'number' ? data.next_after_seq : 0,
        });
      }
    } catch (err) {
      this.#log.debug('marconi: drain failed', { err: String(err) });
    }
  }

  // ---- acknowledgement ----

  /**
   * Acknowledges every signal up to upTo: on the WebSocket when attached,
   * else over HTTP. A failed ack is only logged: the signals come again and
   * are deduplicated.
   * @param {number} epoch
   * @param {number} upTo
   * @param {string} history the store history the signals came under (sent with an HTTP ack)
   */
  async #ack(epoch, upTo, history) {
    if (upTo <= 0 || epoch !== this.#epoch) return; // the registration these signals belonged to is gone
    const ws = this.#conn?.ws;
    if (ws && ws.readyState === WebSocket.OPEN) {
      const sent = await new Promise((resolve) => ws.send(JSON.stringify({ type: 'ack', up_to_seq: upTo }), (err) => resolve(!err)));
      if (sent) {
        this.#stats.acks++;
        return;
      }
    }
    try {
      const body = history ? { up_to_seq: upTo, history } : { up_to_seq: upTo };
      await this.#sessionCall('POST', '/v1/signals/ack', { body: JSON.stringify(body) });
      this.#stats.acks++;
    } catch (err) {
      if (this.#closing.signal.aborted) return;
      if (err instanceof MarconiError && err.code === codes.historyChanged) {
        // The store moved to another history since these signals came:
        // nothing was acknowledged, and the next drain brings them again.
        this.#log.info("marconi: ack refused: the hub's store moved to another history since these signals came; they come again", { up_to_seq: upTo, history });
        return;
      }
      this.#log.warn('marconi: ack failed', { up_to_seq: upTo, err: String(err) });
    }
  }
}

/**
 * The delivery of the pending signals of a send or heartbeat answer: a page
 * from the acknowledged seq, under the store history the answer names.
 * @param {any} data the answer
 * @param {number} epoch
 * @returns {import('./delivery.js').Delivery}
 */
function pendingPage(data, epoch) {
  const signals = data.pending.map(toSignal);
  return {
    signals, epoch, history: typeof data.history === 'string' ? data.history : '',
    page: true, through: signals.length > 0 ? signals[signals.length - 1].seq : 0,
  };
}
