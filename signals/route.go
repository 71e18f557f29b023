package signals

import (
	"context"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// RouteState is whether the hub can reach a session (docs/api.md "Route
// state"); it is the route_state field on the wire.
type RouteState string

// Route states of a session.
const (
	StateAttached          RouteState = "attached"
	StateRouteWithoutQueue RouteState = "route_without_queue"
	StateStale             RouteState = "stale"
	StateNotRegistered     RouteState = "not_registered"
)

// Delivery is how a send was classified; it is the delivery field of a send's
// answer.
type Delivery string

// Delivery classifications of a send.
const (
	DeliveryPushed              Delivery = "pushed_to_ws"
	DeliveryQueuedOffline       Delivery = "queued_offline"
	DeliveryNotAvailableOffline Delivery = "not_available_offline"
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
func Classify(s sessionstore.Session, r Route, now time.Time, freshness time.Duration) RouteState {
	switch {
	case r.Attached:
		return StateAttached
	case now.Sub(s.FreshestProofOfLife()) <= freshness:
		return StateRouteWithoutQueue
	default:
		return StateStale
	}
}

// DeliveryFor maps a recipient's route state to the send's delivery field.
func DeliveryFor(state RouteState) Delivery {
	switch state {
	case StateAttached:
		return DeliveryPushed
	case StateRouteWithoutQueue:
		return DeliveryQueuedOffline
	default:
		return DeliveryNotAvailableOffline
	}
}
