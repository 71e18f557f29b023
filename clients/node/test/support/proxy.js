// A TCP proxy between a client and a hub, to break the path in the ways a
// network does: freeze a WebSocket half-open, lose the answer to a request.

import net from 'node:net';

/**
 * @typedef {object} Piped
 * @property {net.Socket} client
 * @property {net.Socket} upstream
 * @property {boolean} ws the connection carries a WebSocket
 * @property {boolean} frozen the hub's side is cut; the client's side stays open and silent
 * @property {boolean} stalled nothing is forwarded either way; both sides stay open (a path that died silently)
 * @property {boolean} dropAnswer the next bytes from the hub are lost and the connection cut
 * @property {string} sent what the client sent, as latin1 (a WebSocket's handshake only)
 */

/**
 * @typedef {object} RequestHead
 * @property {string} method
 * @property {string} path
 * @property {Record<string, string>} headers lower-case names
 */

/** A proxy on a loopback port in front of 127.0.0.1:targetPort. */
export class Proxy {
  /** @type {Set<Piped>} */
  #conns = new Set();
  /** @type {Piped[]} every connection the proxy served, for requests() */
  #all = [];
  /** @type {string | null} a request line prefix whose answer is to be lost, once */
  #loseAnswerTo = null;
  #lost = 0;
  #refuseWS = false;
  /** @type {string | null} */
  #wsToken = null;

  /** @param {number} targetPort */
  constructor(targetPort) {
    this.targetPort = targetPort;
    this.server = net.createServer((c) => this.#serve(c));
  }

  /** Listens on a free loopback port; resolves with the proxy's base URL. */
  async listen() {
    await new Promise((resolve) => this.server.listen(0, '127.0.0.1', () => resolve(undefined)));
    const addr = /** @type {net.AddressInfo} */ (this.server.address());
    this.url = `http://127.0.0.1:${addr.port}`;
    return this.url;
  }

  /** @param {net.Socket} client */
  #serve(client) {
    const upstream = net.connect(this.targetPort, '127.0.0.1');
    /** @type {Piped} */
    const p = { client, upstream, ws: false, frozen: false, stalled: false, dropAnswer: false, sent: '' };
    this.#conns.add(p);
    this.#all.push(p);
    let first = true;
    client.on('data', (chunk) => {
      if (first) {
        const head = chunk.toString('latin1');
        p.ws = head.startsWith('GET /v1/ws');
        if (p.ws) this.#wsToken = /^authorization: Bearer (\S+)\r$/im.exec(head)?.[1] ?? null;
      }
      if (first || !p.ws) p.sent += chunk.toString('latin1');
      first = false;
      if (p.ws && this.#refuseWS) {
        client.destroy();
        upstream.destroy();
        return;
      }
      if (p.frozen || p.stalled) return; // swallowed: the hub's side is gone, or the path is dead
      const head = chunk.toString('latin1', 0, 64);
      if (this.#loseAnswerTo && head.startsWith(this.#loseAnswerTo)) {
        this.#loseAnswerTo = null;
        p.dropAnswer = true;
      }
      upstream.write(chunk);
    });
    upstream.on('data', (chunk) => {
      if (p.stalled) return;
      if (p.dropAnswer) {
        this.#lost++;
        client.destroy();
        upstream.destroy();
        return;
      }
      client.write(chunk);
    });
    const end = () => {
      if (!p.frozen) client.destroy();
      upstream.destroy();
      if (!p.frozen) this.#conns.delete(p);
    };
    upstream.on('close', end);
    upstream.on('error', end);
    client.on('close', () => {
      upstream.destroy();
      this.#conns.delete(p);
    });
    client.on('error', () => upstream.destroy());
  }

  /**
   * The head of every request the clients sent through the proxy so far, in
   * the order of their connections (a WebSocket's handshake included).
   * @returns {RequestHead[]}
   */
  requests() {
    /** @type {RequestHead[]} */
    const out = [];
    for (const p of this.#all) {
      for (const m of p.sent.matchAll(/(GET|POST|PUT|DELETE) (\S+) HTTP\/1\.1\r\n([\s\S]*?)\r\n\r\n/g)) {
        /** @type {Record<string, string>} */
        const headers = {};
        for (const line of m[3].split('\r\n')) {
          const i = line.indexOf(':');
          if (i > 0) headers[line.slice(0, i).toLowerCase()] = line.slice(i + 1).trim();
        }
        out.push({ method: m[1], path: m[2], headers });
      }
    }
    return out;
  }

  /**
   * Cuts the hub's side of every WebSocket through the proxy and keeps the
   * clients' sides open and silent: the hub detaches the session's queue, the
   * client still believes it is attached (SPEC-168's asymmetry).
   */
  freezeWebSockets() {
    let n = 0;
    for (const p of this.#conns) {
      if (p.ws && !p.frozen) {
        p.frozen = true;
        p.upstream.destroy();
        n++;
      }
    }
    return n;
  }

  /**
   * Stops every WebSocket through the proxy from carrying anything, either
   * way, and keeps both of its sides open: a path that died silently (a NAT
   * or balancer that forgot it). Neither end gets a FIN. New connections pass.
   */
  stallWebSockets() {
    let n = 0;
    for (const p of this.#conns) {
      if (p.ws && !p.stalled && !p.frozen) {
        p.stalled = true;
        n++;
      }
    }
    return n;
  }

  /** The session token of the last WebSocket handshake through the proxy (from its Authorization header). */
  get webSocketToken() {
    return this.#wsToken;
  }

  /**
   * While on, a WebSocket handshake through the proxy is cut at once (the
   * hub never sees it); plain HTTP passes.
   * @param {boolean} on
   */
  refuseWebSockets(on) {
    this.#refuseWS = on;
  }

  /** Cuts both sides of every WebSocket through the proxy: an abnormal close as both ends see it. */
  severWebSockets() {
    let n = 0;
    for (const p of this.#conns) {
      if (p.ws) {
        p.upstream.destroy();
        p.client.destroy();
        n++;
      }
    }
    return n;
  }

  /**
   * The next request whose request line starts with prefix reaches the hub,
   * and its answer is lost: the connection is cut when the hub answers.
   * @param {string} prefix e.g. "POST /v1/signals "
   */
  loseNextAnswer(prefix) {
    this.#loseAnswerTo = prefix;
  }

  /** How many answers were lost so far. */
  get lost() {
    return this.#lost;
  }

  async close() {
    for (const p of this.#conns) {
      p.client.destroy();
      p.upstream.destroy();
    }
    await new Promise((resolve) => this.server.close(() => resolve(undefined)));
  }
}
