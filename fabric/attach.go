package fabric

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Reasons of a fallback event.
const (
	// ReasonInstanceUnhealthy: the sticky session's assigned instance was
	// unhealthy (heartbeat too old, or draining) when the session attached
	// elsewhere. Counted in fallbacks.
	ReasonInstanceUnhealthy = "instance_unhealthy"
	// ReasonGraceExpired: the session had no queue for longer than the
	// reconnect grace window; its old affinity is no part of the contract and
	// the attach is a new placement. Counted in reassignments.
	ReasonGraceExpired = "grace_expired"
)

// Placement is the outcome of an attach's placement decision.
type Placement struct {
	// Resumed: an earlier attachment ended within the grace window (or is
	// being replaced) and the affinity holds.
	Resumed bool
	// AffinityReset: this instance took a sticky session over; runtime-local
	// state is gone and the client must rehydrate it.
	AffinityReset bool
	// Dropped is how many pending signals the drop policy discarded at the
	// reset; nil when it did not apply.
	Dropped *int
}

// queueGap says whether sess has a live queue and, when not, since when it
// has had none (zero when it never had one). A queue recorded on an instance
// that is not healthy is gone: it ended no earlier than that instance's last
// heartbeat. A queue recorded on this instance that this process does not
// hold ended no earlier than this process started. Both bounds err towards an
// earlier end: a later reading could claim a resume the contract no longer
// holds.
func (f *Fabric) queueGap(ctx context.Context, sess sessionstore.Session, hasLocalQueue bool) (live bool, since time.Time) {
	switch q := sess.QueueInstance; {
	case hasLocalQueue:
		return true, time.Time{}
	case q == "":
		return false, sess.QueueDetachedAt
	case q == f.cfg.InstanceID:
		since = sess.QueueAttachedAt
		if since.Before(f.startedAt) {
			since = f.startedAt
		}
		return false, since
	case f.Healthy(ctx, q):
		return true, time.Time{}
	default:
		since = sess.QueueAttachedAt
		f.mu.RLock()
		if hb := f.instances[q].LastHeartbeatAt; hb.After(since) {
			since = hb
		}
		f.mu.RUnlock()
		return false, since
	}
}

// Place decides whether sess may attach on this instance, and with what
// welcome. A stateless session attaches anywhere and is never reset. A
// sticky session whose assigned instance is another healthy one gets
// wrong_instance, unless it has had no queue for longer than the grace
// window; when its assigned instance is unhealthy, or the grace window has
// passed, this instance takes it over: the assignment moves here, a fallback
// event is recorded, the drop policy applies, and the welcome says
// affinity_reset. Errors: wrong_instance, session_expired (the session went
// meanwhile), or a wrapped store error.
func (f *Fabric) Place(ctx context.Context, sess sessionstore.Session, hasLocalQueue bool) (Placement, error) {
	now := f.now()
	live, since := f.queueGap(ctx, sess, hasLocalQueue)
	withinGrace := live || (!since.IsZero() && now.Sub(since) <= f.cfg.Grace)
	neverAttached := !live && since.IsZero()
	if sess.RuntimeMode != ModeSticky {
		return Placement{Resumed: withinGrace}, nil
	}
	if err := f.ensureLoaded(ctx); err != nil {
		return Placement{}, err
	}
	self := f.cfg.InstanceID
	switch assigned := sess.AssignedInstance; {
	case assigned == "":
		// A sticky session that was never placed (none today): place it here.
		if err := f.assign(ctx, sess.Key); err != nil {
			return Placement{}, err
		}
		return Placement{}, nil
	case assigned != self && f.Healthy(ctx, assigned):
		if withinGrace || neverAttached {
			return Placement{}, &marconi.Error{
				Code:        marconi.CodeWrongInstance,
				Message:     fmt.Sprintf("session %q is placed on instance %q; attach there", sess.SessionID, assigned),
				InstanceID:  assigned,
				InstanceURL: f.URL(assigned),
			}
		}
		return f.takeOver(ctx, sess, ReasonGraceExpired)
	case assigned != self:
		return f.takeOver(ctx, sess, ReasonInstanceUnhealthy)
	case withinGrace:
		return Placement{Resumed: true}, nil
	case neverAttached:
		return Placement{}, nil
	default:
		// Assigned here, but the grace window passed: a new placement, even
		// on the same instance. Nothing runtime-local is promised to survive.
		return f.takeOver(ctx, sess, ReasonGraceExpired)
	}
}

func (f *Fabric) assign(ctx context.Context, k sessionstore.Key) error {
	err := f.store.AssignInstance(ctx, k, f.cfg.InstanceID)
	if errors.Is(err, sessionstore.ErrNotFound) {
		return marconi.Errorf(marconi.CodeSessionExpired, "this session expired; register again")
	}
	if err != nil {
		return fmt.Errorf("assign session to %s: %w", f.cfg.InstanceID, err)
	}
	return nil
}

// takeOver moves sess's assignment to this instance and records why.
func (f *Fabric) takeOver(ctx context.Context, sess sessionstore.Session, reason string) (Placement, error) {
	now := f.now()
	if err := f.assign(ctx, sess.Key); err != nil {
		return Placement{}, err
	}
	p := Placement{AffinityReset: true}
	if f.cfg.DisconnectPolicy == PolicyDrop {
		n, err := f.store.DropPending(ctx, sess.Key, now)
		if err != nil {
			return Placement{}, fmt.Errorf("drop pending at affinity reset: %w", err)
		}
		f.m.signalsDropped.WithLabelValues("affinity_reset").Add(float64(n))
		p.Dropped = &n
	}
	counter, metric := sessionstore.CounterFallbacks, f.m.fallbacks
	if reason == ReasonGraceExpired {
		counter, metric = sessionstore.CounterReassignments, f.m.reassignments
	}
	err := f.store.RecordFallback(ctx, sessionstore.FallbackEvent{
		Key: sess.Key, FromInstance: sess.AssignedInstance, ToInstance: f.cfg.InstanceID,
		RuntimeMode: sess.RuntimeMode, RuntimeModeSource: sess.RuntimeModeSource,
		Reason: reason, At: now, Counter: counter,
	})
	if err != nil {
		return Placement{}, fmt.Errorf("record fallback: %w", err)
	}
	metric.Inc()
	dropped := 0
	if p.Dropped != nil {
		dropped = *p.Dropped
	}
	f.log.Info("sticky session taken over", "session_id", sess.SessionID, "tenant_id", sess.TenantID,
		"project_id", sess.ProjectID, "from_instance", sess.AssignedInstance, "reason", reason,
		"runtime_mode_source", sess.RuntimeModeSource, "dropped", dropped)
	return p, nil
}
