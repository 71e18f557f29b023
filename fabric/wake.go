package fabric

import (
	"context"

	"github.com/marconihub/marconi/sessionstore"
)

// Bus carries wake-ups between instances that share one store: a send on one
// instance that stored a signal for a queue held by another tells that
// instance to catch the queue up from the store. A wake-up is a hint only:
// the stored row is the truth, and a lost wake-up delays a signal until the
// holder's pending sweep, it never loses it. Implementations are safe for
// concurrent use.
type Bus interface {
	// Publish tells instance that k has a new signal with seq, or, with
	// seq CheckSeq, that k's row changed and its connection is to be
	// checked against it. It returns an
	// error when the wake-up could not be handed to the bus; the caller
	// logs it and relies on the sweep.
	Publish(ctx context.Context, instance string, k sessionstore.Key, seq int64) error
	// Listen delivers the wake-ups addressed to instance to onWake until ctx
	// ends, reconnecting as needed. It calls onConnect each time it starts
	// listening (first time and after every reconnect), since wake-ups sent
	// while it was not listening are lost. It returns nil when ctx ends, or
	// at once when the bus has nothing to listen to.
	Listen(ctx context.Context, instance string, onWake func(k sessionstore.Key, seq int64), onConnect func()) error
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
func (NoBus) Publish(context.Context, string, sessionstore.Key, int64) error { return nil }

// Listen implements Bus: it returns at once.
func (NoBus) Listen(context.Context, string, func(sessionstore.Key, int64), func()) error {
	return nil
}

// SetBus sets the bus that Wake publishes on; nil means NoBus. Call it
// before the fabric is used.
func (f *Fabric) SetBus(b Bus) {
	if b == nil {
		b = NoBus{}
	}
	f.bus = b
}

// wake publishes a wake-up for instance, best effort: a failure is logged,
// and the holder's pending sweep delivers the signal later.
func (f *Fabric) wake(ctx context.Context, instance string, k sessionstore.Key, seq int64) {
	if f.bus == nil || instance == "" || instance == f.cfg.InstanceID {
		return
	}
	if err := f.bus.Publish(ctx, instance, k, seq); err != nil {
		f.log.Warn("cross-instance wake-up not sent; the pending sweep will deliver the signal",
			"to_instance", instance, "tenant_id", k.TenantID, "project_id", k.ProjectID, "session_id", k.SessionID, "seq", seq, "err", err)
	}
}
