package fabric

import (
	"context"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// Bus carries wake-ups between instances that share one store: a send on one
// instance that stored a signal for a queue held by another tells that
// instance to push the signal, or to catch the queue up from the store. It
// is the seam of the cross-instance path: the connection hub publishes and
// listens on it, and the deployment picks the engine (pgstore.Bus, or NoBus
// for one instance). A wake-up is a hint only: the stored row is the truth,
// and a lost wake-up delays a signal until the holder's pending sweep, it
// never loses it. Implementations are safe for concurrent use.
type Bus interface {
	// Publish tells instance that w.Key has a new signal, w.Seq, carrying
	// w.Signal along when the bus can; or, with w.Seq CheckSeq, that
	// w.Key's row changed and its connection is to be checked against it. Call it once the signal is stored. It
	// returns an error when the wake-up could not be handed to the bus; the
	// caller logs it and relies on the sweep.
	Publish(ctx context.Context, instance string, w sessionstore.Wake) error
	// Listen delivers the wake-ups addressed to instance to onWake until ctx
	// ends, reconnecting as needed; a delivered wake-up's Signal, when set,
	// is the signal its publisher stored. It calls onConnect each time it
	// starts listening (first time and after every reconnect), since
	// wake-ups sent while it was not listening are lost. It returns nil when
	// ctx ends, or at once when the bus has nothing to listen to. startedAt
	// is this process's (Members.StartedAt): a bus that is also the Prober
	// holds the liveness of the process of instance started then.
	Listen(ctx context.Context, instance string, startedAt time.Time, onWake func(sessionstore.Wake), onConnect func()) error
}

// CheckSeq is the seq of a check wake-up: not a new signal, but a change of
// the session's row made elsewhere (its token replaced, the session ended),
// which the instance holding its connection checks the connection against.
// Signal seqs start at 1.
const CheckSeq int64 = 0

// NoBus is the bus of a lone instance (the in-memory store): there is no
// other instance to wake. It is safe for concurrent use.
type NoBus struct{}

var _ Bus = NoBus{}

// Publish implements Bus: there is nobody to tell.
func (NoBus) Publish(context.Context, string, sessionstore.Wake) error { return nil }

// Listen implements Bus: it returns at once.
func (NoBus) Listen(context.Context, string, time.Time, func(sessionstore.Wake), func()) error {
	return nil
}
