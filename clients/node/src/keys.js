// The idempotency key of a send that names none.

import { randomBytes } from 'node:crypto';

/** The last millisecond a key was made in, and the keys made in it so far. */
let lastMs = 0;
let seq = 0;

/**
 * A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, a 12-bit counter of
 * the keys made in that millisecond, then 62 random bits; each one made
 * sorts after the one before, as the Go client's keys do. Keys that grow
 * with time are added at the end of the store's index of each sender's
 * keys rather than on a random page of it, which after every checkpoint
 * cost nearly every send a full-page image in the WAL
 * (docs/benchmarks-history.md, "Time-ordered idempotency keys").
 * @returns {string}
 */
export function newIdempotencyKey() {
  let ms = Date.now();
  if (ms > lastMs) {
    lastMs = ms;
    seq = 0;
  } else if (++seq > 0xfff) { // 4096 keys in one millisecond: borrow the next one
    lastMs++;
    seq = 0;
  }
  ms = lastMs;
  const b = randomBytes(16);
  b.writeUIntBE(ms, 0, 6);
  b[6] = 0x70 | (seq >> 8);
  b[7] = seq & 0xff;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}
