// Delivery: one bounded queue and one loop that hands each signal to onSignal
// once, in seq order, and acknowledges it after.

import { Sequencer } from './sequencer.js';

/**
 * The delivery queue's bound: past it the WebSocket stops being read (the
 * hub keeps the signals) and piggyback or drained signals are left on the hub.
 */
const deliveryQueue = 64;
// How many deliveries may be handled before an ack is sent even though more are queued.
const ackEvery = 32;

/**
 * @typedef {import('../index.js').Signal} Signal
 * @typedef {import('../index.js').AffinityReset} AffinityReset
 * @typedef {{signals: Signal[], epoch: number, reset?: AffinityReset, history?: string, page?: boolean, through?: number}} Delivery
 *   signals received under registration epoch, possibly preceded by an affinity reset; history is
 *   the token of the hub's store history they were read under ('' or absent: none named); page
 *   says they are a page of an HTTP answer (drain, pending) covering every pending signal up to through
 */

/**
 * @typedef {object} DispatcherOptions
 * @property {AbortSignal} closing ends the loop at the client's close
 * @property {Pick<import('../index.js').Config, 'onSignal' | 'onAffinityReset'>} handlers the application's
 * @property {(epoch: number, upTo: number, history: string) => Promise<void>} ack acknowledges every signal up to upTo,
 *   received under the store history named; never rejects
 * @property {() => void} onRoom the queue has room again: the WebSocket may be read
 * @property {number} ackIntervalMs the least time between two acks (0: none)
 * @property {Required<import('../index.js').Logger>} log
 */

/**
 * The delivery queue and its one loop (run), which calls onSignal and
 * onAffinityReset. Signals come from the WebSocket, from piggyback and from
 * drain; the Sequencer drops any already delivered.
 */
export class Dispatcher {
  /** @type {Delivery[]} */
  #queue = [];
  /** @type {(() => void) | null} */
  #wake = null;
  #highest = 0; // highest seq handed to onSignal (or covered by a drained page), for drain
  #highestEpoch = 0; // the registration #highest belongs to
  #highestHistory = ''; // the store history #highest came under
  #history = ''; // the store history of what was delivered last
  #unacked = 0; // deliveries handled since the last ack
  #lastAck = -Infinity; // performance.now() of the last ack
  /** @type {ReturnType<typeof setTimeout> | null} */
  #pacer = null; // an ack waits for it
  /** @type {(() => Promise<void>) | null} */
  #ackNow = null; // run's, while it runs
  #o;

  /** @param {DispatcherOptions} o */
  constructor(o) {
    this.#o = o;
  }

  /** The queue is at its bound: whoever can stop reading should. */
  get full() {
    return this.#queue.length >= deliveryQueue;
  }

  /**
   * Queues d whatever the bound (the WebSocket's frames, resets: the caller
   * pauses its reading when full).
   * @param {Delivery} d
   */
  enqueue(d) {
    this.#queue.push(d);
    this.#wake?.();
  }

  /**
   * Queues d when there is room and drops it when there is none: the signals
   * stay unacknowledged on the hub and come again (piggyback, drain and the
   * replay on attach all start from the oldest unacknowledged signal).
   * @param {Delivery} d
   */
  offer(d) {
    if (this.full) {
      this.#o.log.debug('marconi: delivery queue full; signals will come again', { signals: d.signals.length });
      return;
    }
    this.enqueue(d);
  }

  /** Wakes the loop, so that it ends once the client is closing. */
  wake() {
    this.#wake?.();
  }

  /**
   * The seq a drain asks for signals after, with the store history it came
   * under: the highest one handed to onSignal (or covered by a drained
   * page), or 0 and no history when that was under an earlier registration
   * than epoch (a new registration numbers its signals afresh).
   * @param {number} epoch
   * @returns {{seq: number, history: string}}
   */
  drainAfter(epoch) {
    return this.#highestEpoch === epoch ? { seq: this.#highest, history: this.#highestHistory } : { seq: 0, history: '' };
  }

  /**
   * Starts delivering under d's history, another than the one delivered
   * under: the hub's store failed over and may have given the seqs delivered
   * to other signals, so only ids deduplicate from here, and drains start
   * from the acknowledged seq (0) under the new history.
   * @param {Sequencer} seq
   * @param {Delivery} d
   */
  #newHistory(seq, d) {
    seq.rebase();
    this.#unacked = 0; // seqs of the old history: an ack of them would be refused
    this.#highest = 0;
    this.#highestEpoch = d.epoch;
    this.#highestHistory = d.history ?? '';
    this.#o.log.warn("marconi: the hub's store moved to another history (a standby promoted): its seqs may name other signals now; deduplicating by id", { history: d.history });
  }

  /** @returns {Promise<Delivery | null>} null once the client closes */
  async #next() {
    while (this.#queue.length === 0) {
      if (this.#o.closing.aborted) return null;
      await new Promise((r) => (this.#wake = () => r(undefined)));
      this.#wake = null;
    }
    if (this.#o.closing.aborted) return null;
    const d = /** @type {Delivery} */ (this.#queue.shift());
    if (this.#queue.length < deliveryQueue / 2) this.#o.onRoom();
    return d;
  }

  /**
   * The one loop that calls onSignal and onAffinityReset, until the client
   * closes. It acknowledges what it delivered after the handler returned:
   * when no other delivery is queued, else at least every ackEvery
   * deliveries; but never sooner than ackIntervalMs after its previous ack
   * (a timer then sends the one that waits, for everything handled
   * meanwhile), so that a recipient handed signals one at a time faster than
   * the hub lets a connection send frames is not cut off for acking each.
   */
  async run() {
    const seq = new Sequencer();
    const ackNow = async () => {
      this.#unacked = 0;
      this.#lastAck = performance.now();
      await this.#o.ack(seq.epoch, seq.highest, this.#history);
    };
    this.#ackNow = ackNow;
    try {
      for (let d = await this.#next(); d; d = await this.#next()) {
        if (d.reset && d.epoch >= seq.epoch) await this.#callback('onAffinityReset', d.reset);
        if (d.history && d.history !== this.#history && d.epoch >= seq.epoch) {
          if (this.#history !== '') this.#newHistory(seq, d);
          this.#history = d.history;
        }
        for (const s of d.signals) {
          if (!seq.accept(d.epoch, s)) continue;
          if (seq.rewound) {
            this.#o.log.warn("marconi: signal delivered below the highest seq delivered: the hub's numbering went back (its store lost its last signals, as an asynchronous standby promoted does)", { signalId: s.id, seq: s.seq });
          }
          this.#highest = s.seq;
          this.#highestEpoch = d.epoch;
          this.#highestHistory = this.#history;
          await this.#callback('onSignal', s);
        }
        if (d.page && d.history && d.history === this.#history && d.epoch === seq.epoch &&
          this.#highestEpoch === d.epoch && this.#highestHistory === d.history && (d.through ?? 0) > this.#highest) {
          // The page covered every pending signal up to through, delivered
          // now or before (under another history): drain after it.
          this.#highest = d.through ?? 0;
        }
        if (d.signals.length > 0 && d.epoch === seq.epoch) this.#unacked++;
        if (this.#unacked > 0 && this.#pacer === null && (this.#queue.length === 0 || this.#unacked >= ackEvery)) {
          const wait = this.#o.ackIntervalMs - (performance.now() - this.#lastAck);
          if (wait > 0) {
            this.#pacer = setTimeout(() => {
              this.#pacer = null;
              if (this.#unacked > 0 && !this.#o.closing.aborted) void ackNow();
            }, wait);
          } else {
            await ackNow();
          }
        }
      }
    } finally {
      if (this.#pacer !== null) clearTimeout(this.#pacer);
      this.#pacer = null;
      this.#ackNow = null;
    }
  }

  /**
   * Sends now the ack that ackIntervalMs holds back, if one waits (the
   * client's close: the signals it covers must not come again to the
   * session's next client). Never rejects.
   * @returns {Promise<void>}
   */
  async flush() {
    if (this.#pacer === null || this.#ackNow === null) return;
    clearTimeout(this.#pacer);
    this.#pacer = null;
    if (this.#unacked > 0) await this.#ackNow();
  }

  /**
   * Calls a handler of the application; a throw is logged and the delivery
   * counts as handled (a poison signal must not stop the session).
   * @param {'onSignal' | 'onAffinityReset'} name
   * @param {any} arg
   */
  async #callback(name, arg) {
    const fn = this.#o.handlers[name];
    if (!fn) return;
    try {
      await fn(arg);
    } catch (err) {
      this.#o.log.error(`marconi: ${name} threw`, { err: String(err) });
    }
  }
}

/**
 * @param {any} s a signal as the hub sends it
 * @returns {Signal}
 */
export function toSignal(s) {
  return {
    id: s.id,
    seq: s.seq,
    fromSession: s.from_session,
    toSession: s.to_session,
    kind: s.kind,
    payload: s.payload,
    createdAt: new Date(s.created_at),
  };
}
