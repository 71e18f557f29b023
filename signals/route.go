package signals

import (
	"context"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Route is where a session's WebSocket queue is, as the queue registry and the
// fabric see it.
type Route struct {
	// Attached is true when a queue is attached on a healthy instance.
	Attached bool
	// InstanceID is the instance holding the queue, healthy or not; empty when none.
	InstanceID string
	// InstanceHealthy reports InstanceID's health.
	InstanceHealthy bool
	// AttachedAt is when the queue attached; zero when none.
	AttachedAt time.Time
}

// Router finds and feeds sessions' queues, wherever they live. The hub's
// queue registry implements it (with the fabric for other instances).
type Router interface {
	// Route reports where s's queue is.
	Route(ctx context.Context, s sessionstore.Session) Route
	// Deliver hands a persisted signal to its recipient's queue if one is
	// attached anywhere; it never blocks on the queue. Best effort: the store
	// row is the truth, and a queue that misses it catches up from the store.
	Deliver(ctx context.Context, to sessionstore.Session, sig sessionstore.Signal)
}

// Classify is the route state of a live session given its route.
func Classify(s sessionstore.Session, r Route, now time.Time, freshness time.Duration) marconi.RouteState {
	switch {
	case r.Attached:
		return marconi.StateAttached
	case now.Sub(s.FreshestProofOfLife()) <= freshness:
		return marconi.StateRouteWithoutQueue
	default:
		return marconi.StateStale
	}
}

// DeliveryFor maps a recipient's route state to the send's delivery field.
func DeliveryFor(state marconi.RouteState) marconi.Delivery {
	switch state {
	case marconi.StateAttached:
		return marconi.DeliveryPushed
	case marconi.StateRouteWithoutQueue:
		return marconi.DeliveryQueuedOffline
	default:
		return marconi.DeliveryNotAvailableOffline
	}
}
