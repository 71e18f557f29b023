// Package signals is the send path of the hub: it persists a signal with its
// per-recipient seq and idempotency key, classifies the recipient's route
// (attached, route_without_queue, stale), runs the SPEC-168 self-heal gates
// for recipient and sender, counts, and hands the signal to the recipient's
// queue through a Router. It also serves drain and ack.
//
// signals knows sessionstore and fabric, never hub: the hub's queue registry
// reaches it through the Router interface declared here.
package signals
