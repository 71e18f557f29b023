// Package signals is the send path of the hub: it persists a signal with its
// per-recipient seq and idempotency key, classifies the recipient's route
// (attached, route_without_queue, stale), runs the SPEC-168 self-heal gates
// for recipient and sender, counts, and hands the signal to the recipient's
// queue through a Router. It also serves drain and ack.
//
// signals knows sessionstore and the root package's wire words, never
// fabric or hub: the connection hub (hub/conns) reaches it through the
// Router interface declared here, and the store through Store, the few
// methods it calls.
package signals
