// Which signals reach the handler: each id once, in seq order.

/** How many recent signal ids the client remembers to deduplicate. */
export const defaultSeenIDs = 4096;

/**
 * Seq is per recipient session and strictly increasing, so a signal whose seq
 * is at or below the highest delivered one was delivered (or passed over)
 * already, unless the hub's numbering went back: a store that lost its last
 * signals (an asynchronous standby promoted after a failover) gives their
 * seqs to the next ones. A signal whose seq names, in the recent ones
 * remembered, a delivered signal of another id is such a new signal: it is
 * delivered, and the order starts again from it (rewound). A new
 * registration of the session (epoch) starts seq afresh: the hub's numbering
 * may start over when it lost the session. Ids are remembered across epochs
 * in a bounded set.
 */
export class Sequencer {
  /** @param {number} capacity */
  constructor(capacity = defaultSeenIDs) {
    this.epoch = 0;
    this.highest = 0;
    /** @type {Set<string>} insertion ordered: the oldest id comes first */
    this.seen = new Set();
    this.capacity = capacity;
    /** @type {Map<number, {epoch: number, id: string}>} the id delivered at each recent seq, at most capacity */
    this.bySeq = new Map();
    /** Set by an accept that delivered a signal below the highest: the hub's numbering went back. */
    this.rewound = false;
  }

  /**
   * Reports whether sig, received under registration epoch, is to be
   * delivered, and records it as delivered when it is. Signals of an older
   * epoch are refused: they belong to a registration that is gone.
   * @param {number} epoch
   * @param {{id: string, seq: number}} sig
   */
  accept(epoch, sig) {
    this.rewound = false;
    if (epoch < this.epoch) return false;
    if (epoch > this.epoch) {
      this.epoch = epoch;
      this.highest = 0;
    }
    if (this.seen.has(sig.id)) return false;
    if (sig.seq <= this.highest) {
      const at = this.bySeq.get(sig.seq);
      // Delivered, or too old to tell: passed over.
      if (at === undefined || at.epoch !== epoch || at.id === sig.id) return false;
      this.rewound = true;
    }
    this.seen.add(sig.id);
    if (this.seen.size > this.capacity) {
      const oldest = this.seen.values().next().value;
      if (oldest !== undefined) this.seen.delete(oldest);
    }
    this.bySeq.delete(sig.seq); // re-inserted last: the map stays in delivery order
    this.bySeq.set(sig.seq, { epoch, id: sig.id });
    if (this.bySeq.size > this.capacity) {
      const oldest = this.bySeq.keys().next().value;
      if (oldest !== undefined) this.bySeq.delete(oldest);
    }
    this.highest = sig.seq;
    return true;
  }

  /**
   * Forgets the highest seq delivered: the hub's store moved to another
   * history, whose seqs may name other signals than those delivered at them,
   * so from here only ids tell a signal delivered.
   */
  rebase() {
    this.highest = 0;
  }
}
