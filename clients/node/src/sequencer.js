// Which signals reach the handler: each id once, in seq order.

/** How many recent signal ids the client remembers to deduplicate. */
export const defaultSeenIDs = 4096;

/**
 * Seq is per recipient session and strictly increasing, so a signal whose seq
 * is at or below the highest delivered one was delivered (or passed over)
 * already. A new registration of the session (epoch) starts seq afresh: the
 * hub's numbering may start over when it lost the session. Ids are remembered
 * across epochs in a bounded set.
 */
export class Sequencer {
  /** @param {number} capacity */
  constructor(capacity = defaultSeenIDs) {
    this.epoch = 0;
    this.highest = 0;
    /** @type {Set<string>} insertion ordered: the oldest id comes first */
    this.seen = new Set();
    this.capacity = capacity;
  }

  /**
   * Reports whether sig, received under registration epoch, is to be
   * delivered, and records it as delivered when it is. Signals of an older
   * epoch are refused: they belong to a registration that is gone.
   * @param {number} epoch
   * @param {{id: string, seq: number}} sig
   */
  accept(epoch, sig) {
    if (epoch < this.epoch) return false;
    if (epoch > this.epoch) {
      this.epoch = epoch;
      this.highest = 0;
    }
    if (sig.seq <= this.highest || this.seen.has(sig.id)) return false;
    this.seen.add(sig.id);
    if (this.seen.size > this.capacity) {
      const oldest = this.seen.values().next().value;
      if (oldest !== undefined) this.seen.delete(oldest);
    }
    this.highest = sig.seq;
    return true;
  }
}
