// Exponential backoff with full jitter.

/**
 * The wait before attempt n (from 0) is uniform in [0, min(maxMs, baseMs·2ⁿ)).
 * Full jitter spreads the clients of a restarted hub over the whole window
 * instead of letting them reconnect in waves.
 */
export class Backoff {
  /**
   * @param {number} baseMs ceiling of the first attempt
   * @param {number} maxMs cap of the ceiling
   * @param {() => number} [random] uniform in [0, 1); injected by tests
   */
  constructor(baseMs, maxMs, random = Math.random) {
    this.baseMs = baseMs;
    this.maxMs = maxMs;
    this.random = random;
  }

  /** @param {number} attempt */
  ceiling(attempt) {
    let d = this.baseMs;
    for (let i = 0; i < attempt && d < this.maxMs; i++) d *= 2;
    return Math.min(d, this.maxMs);
  }

  /**
   * This backoff with its ceiling capped at maxMs (a copy).
   * @param {number} maxMs
   */
  capped(maxMs) {
    return new Backoff(this.baseMs, Math.min(this.maxMs, maxMs), this.random);
  }

  /** @param {number} attempt */
  delay(attempt) {
    return Math.floor(this.random() * this.ceiling(attempt));
  }
}
