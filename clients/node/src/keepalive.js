// The keepalive of one WebSocket: finds a path that died silently.

/**
 * @typedef {object} KeepaliveOptions
 * @property {number} intervalMs time between a pong (or the start) and the next ping
 * @property {number} timeoutMs a ping unanswered within it means the path is dead
 * @property {() => void} onDead called once, when a ping went unanswered while the socket was read
 * @property {(msg: string, fields: object) => void} debug
 */

/**
 * Pings the hub on ws every intervalMs until ws closes, and calls onDead when
 * no pong came within timeoutMs. A socket paused for backpressure (onSignal
 * busy) does not read the pong: a ping unanswered while it was paused is not
 * judged. The caller closes the socket; its close stops the keepalive.
 * @param {import('ws').WebSocket} ws
 * @param {KeepaliveOptions} o
 */
export function keepalive(ws, o) {
  /** @type {NodeJS.Timeout | undefined} */
  let timer;
  let pausedAtPing = false;
  const schedule = (/** @type {() => void} */ fn, /** @type {number} */ ms) => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
    timer.unref(); // the socket keeps the process alive, not its keepalive
  };
  const unanswered = () => {
    if (pausedAtPing || ws.isPaused) {
      o.debug('marconi: ping unanswered while onSignal held the socket paused; not judged', {});
      schedule(ping, o.intervalMs);
      return;
    }
    stop();
    o.onDead();
  };
  const ping = () => {
    if (ws.readyState !== ws.OPEN) return;
    pausedAtPing = ws.isPaused;
    ws.ping();
    schedule(unanswered, o.timeoutMs);
  };
  const onPong = () => schedule(ping, o.intervalMs);
  const stop = () => {
    clearTimeout(timer);
    ws.off('pong', onPong);
    ws.off('close', stop);
  };
  ws.on('pong', onPong);
  ws.on('close', stop);
  schedule(ping, o.intervalMs);
}
