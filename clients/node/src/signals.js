// Cancellation without AbortSignal.any: a signal combined per call from a
// long-lived one (the client's close) is retained by it in Node 20
// (nodejs/node#55351), so every call would leak. Here each call links its
// own controller to its sources and unlinks when it is done.

/**
 * A signal that aborts when any of sources aborts, or after timeoutMs when
 * given. Call done() when the operation ends, to unlink it.
 * @param {(AbortSignal | undefined)[]} sources
 * @param {number} [timeoutMs]
 * @returns {{signal: AbortSignal, done: () => void}}
 */
export function linked(sources, timeoutMs) {
  const ac = new AbortController();
  const present = /** @type {AbortSignal[]} */ (sources.filter(Boolean));
  const onAbort = (/** @type {Event} */ ev) => ac.abort(/** @type {AbortSignal} */ (ev.target).reason);
  /** @type {NodeJS.Timeout | undefined} */
  let timer;
  const done = () => {
    clearTimeout(timer);
    for (const s of present) s.removeEventListener('abort', onAbort);
  };
  for (const s of present) {
    if (s.aborted) {
      ac.abort(s.reason);
      return { signal: ac.signal, done: () => {} };
    }
    s.addEventListener('abort', onAbort, { once: true });
  }
  if (timeoutMs !== undefined) {
    timer = setTimeout(() => ac.abort(new DOMException(`timed out after ${timeoutMs}ms`, 'TimeoutError')), timeoutMs);
  }
  return { signal: ac.signal, done };
}
