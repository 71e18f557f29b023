package sessionstore

import "time"

// Wake is a message on the bus between instances, addressed to the instance
// that holds Key's queue: Key's signal Seq is stored. The stored row stays
// the record; a wake-up only saves the holder waiting for its pending sweep.
type Wake struct {
	Key Key
	Seq int64
	// Signal, when set, is the stored signal Seq itself (Signal.Seq == Seq),
	// carried so that the holder pushes it without reading it back. A bus
	// may leave it out (a payload too large to carry); the holder then
	// reads the store.
	Signal *Signal
	// Incarnation is the RegisteredAt of the session row the signal was
	// stored for: the holder pushes a carried signal only to a connection
	// of that incarnation of the session.
	Incarnation time.Time
}
