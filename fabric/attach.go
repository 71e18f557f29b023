package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// placerStore is what Placer needs of the store.
type placerStore interface {
	ReassignInstance(ctx context.Context, k sessionstore.Key, from, to string) (bool, error)
	GetSession(ctx context.Context, k sessionstore.Key, now time.Time) (sessionstore.Session, error)
	DropPending(ctx context.Context, k sessionstore.Key, now time.Time) (int, error)
	RecordFallback(ctx context.Context, e sessionstore.FallbackEvent) error
	SessionStats(ctx context.Context, now time.Time) (sessionstore.SessionStats, error)
	ListSessions(ctx context.Context, f sessionstore.SessionFilter, now time.Time) ([]sessionstore.Session, error)
}

// Placer is the fabric's placement and takeover: it decides whether a
// session may attach on this instance and with what welcome, takes sticky
// sessions over from unhealthy instances, and assigns new sticky sessions.
// It judges health through Members. It is safe for concurrent use.
type Placer struct {
	cfg     Config
	self    string
	members *Members
	store   placerStore
	now     func() time.Time
	log     *slog.Logger
	m       *metrics
}

func newPlacer(cfg Config, members *Members, d Deps, m *metrics) *Placer {
	return &Placer{cfg: cfg, self: cfg.InstanceID, members: members, store: d.Store, now: d.Now, log: d.Logger, m: m}
}

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
// hold ended no earlier than this process started; so did one recorded on
// another instance that has restarted since (same id, later StartedAt: the
// queue died with the old process, which a crash leaves in the store). These
// bounds err towards an earlier end: a later reading could claim a resume the
// contract no longer holds.
func (p *Placer) queueGap(ctx context.Context, sess sessionstore.Session, hasLocalQueue bool) (live bool, since time.Time) {
	switch q := sess.QueueInstance; {
	case hasLocalQueue:
		return true, time.Time{}
	case q == "":
		return false, sess.QueueDetachedAt
	case q == p.self:
		since = sess.QueueAttachedAt
		if since.Before(p.members.startedAt) {
			since = p.members.startedAt
		}
		return false, since
	case p.members.HoldsQueue(ctx, q, sess.QueueAttachedAt):
		return true, time.Time{}
	}
	if started, ok := p.members.restartedSince(sess.QueueInstance, sess.QueueAttachedAt); ok {
		return false, started
	}
	since = sess.QueueAttachedAt
	if hb := p.members.lastHeartbeat(sess.QueueInstance); hb.After(since) {
		since = hb
	}
	return false, since
}

// maxPlaceRounds bounds how often one attach re-decides after losing a race
// for the assignment. A second loss needs the winner to have become
// unhealthy within the same request; a third is not expected at all.
const maxPlaceRounds = 3

// Place decides whether sess may attach on this instance, and with what
// welcome. A stateless session attaches anywhere and is never reset. A
// sticky session whose assigned instance is another healthy one gets
// wrong_instance, unless it has had no queue for longer than the grace
// window; when its assigned instance is unhealthy, or the grace window has
// passed, this instance takes it over: the assignment moves here, a fallback
// event is recorded, the drop policy applies, and the welcome says
// affinity_reset. The move is a compare-and-set on the assignment sess
// carries: when several instances take the same session over at once,
// exactly one wins, and only the winner records the event and drops
// signals; the others answer as the new assignment says (see lostTakeover).
// Errors: wrong_instance, session_expired (the session went meanwhile), or a
// wrapped store error.
func (p *Placer) Place(ctx context.Context, sess sessionstore.Session, hasLocalQueue bool) (Placement, error) {
	return p.place(ctx, sess, hasLocalQueue, 1)
}

func (p *Placer) place(ctx context.Context, sess sessionstore.Session, hasLocalQueue bool, round int) (Placement, error) {
	now := p.now()
	live, since := p.queueGap(ctx, sess, hasLocalQueue)
	withinGrace := live || (!since.IsZero() && now.Sub(since) <= p.cfg.Grace)
	neverAttached := !live && since.IsZero()
	if sess.RuntimeMode != ModeSticky {
		return Placement{Resumed: withinGrace}, nil
	}
	if err := p.members.ensureLoaded(ctx); err != nil {
		return Placement{}, err
	}
	if err := p.refreshUnlessHealthy(ctx, sess.AssignedInstance); err != nil {
		return Placement{}, err
	}
	self := p.self
	switch assigned := sess.AssignedInstance; {
	case assigned == "":
		// A sticky session that was never placed (none today): place it
		// here, unless another attach placed it meanwhile.
		moved, err := p.reassign(ctx, sess.Key, "")
		if err != nil {
			return Placement{}, err
		}
		if !moved {
			return p.replace(ctx, sess.Key, hasLocalQueue, round)
		}
		return Placement{}, nil
	case assigned != self && p.members.confirmHealthy(ctx, assigned):
		if withinGrace || neverAttached {
			return Placement{}, p.wrongInstance(ctx, sess.SessionID, assigned)
		}
		return p.takeOver(ctx, sess, ReasonGraceExpired, hasLocalQueue, round)
	case assigned != self:
		return p.takeOver(ctx, sess, ReasonInstanceUnhealthy, hasLocalQueue, round)
	case withinGrace:
		return Placement{Resumed: true}, nil
	case neverAttached:
		return Placement{}, nil
	default:
		// Assigned here, but the grace window passed: a new placement, even
		// on the same instance. Nothing runtime-local is promised to survive.
		return p.takeOver(ctx, sess, ReasonGraceExpired, hasLocalQueue, round)
	}
}

func (p *Placer) wrongInstance(ctx context.Context, sessionID, assigned string) error {
	return &marconi.Error{
		Code:        marconi.CodeWrongInstance,
		Message:     fmt.Sprintf("session %q is placed on instance %q; attach there", sessionID, assigned),
		InstanceID:  assigned,
		InstanceURL: p.members.URL(ctx, assigned),
	}
}

// reassign moves k's assignment from from to this instance, only while it
// is still from, and reports whether it moved.
func (p *Placer) reassign(ctx context.Context, k sessionstore.Key, from string) (bool, error) {
	moved, err := p.store.ReassignInstance(ctx, k, from, p.self)
	if errors.Is(err, sessionstore.ErrNotFound) {
		return false, errSessionExpired()
	}
	if err != nil {
		return false, fmt.Errorf("reassign session from %q to %s: %w", from, p.self, err)
	}
	return moved, nil
}

// errKeepsMoving is internal: one attach lost the race for the assignment
// round times in a row.
func errKeepsMoving(k sessionstore.Key, round int) error {
	return fmt.Errorf("session %s/%s/%s: the sticky assignment moved %d times during one attach",
		k.TenantID, k.ProjectID, k.SessionID, round)
}

func errSessionExpired() error {
	return marconi.Errorf(marconi.CodeSessionExpired, "this session expired; register again")
}

// current re-reads k after a lost race, and refreshes the view of the
// instances when it does not hold the new assignment healthy: the winner may
// have joined since the last tick, and a stale view would take the session
// straight back from it.
func (p *Placer) current(ctx context.Context, k sessionstore.Key) (sessionstore.Session, error) {
	sess, err := p.store.GetSession(ctx, k, p.now())
	if errors.Is(err, sessionstore.ErrNotFound) {
		return sessionstore.Session{}, errSessionExpired()
	}
	if err != nil {
		return sessionstore.Session{}, fmt.Errorf("re-read session after a lost assignment race: %w", err)
	}
	if err := p.refreshUnlessHealthy(ctx, sess.AssignedInstance); err != nil {
		return sessionstore.Session{}, err
	}
	return sess, nil
}

// refreshUnlessHealthy reads the instance table again when assigned is
// another instance that the view does not hold healthy: it may have joined
// since the last tick (two instances started together, or a winner of an
// assignment race), and a stale view would take its session over while it
// is healthy. A takeover is rare, so is this read; an instance that is
// really dead stays so after it.
func (p *Placer) refreshUnlessHealthy(ctx context.Context, assigned string) error {
	if assigned == "" || assigned == p.self || p.members.Healthy(ctx, assigned) {
		return nil
	}
	return p.members.Refresh(ctx)
}

// replace decides again on the session as it is now, after the assignment
// moved between the read this attach decided on and its write.
func (p *Placer) replace(ctx context.Context, k sessionstore.Key, hasLocalQueue bool, round int) (Placement, error) {
	if round >= maxPlaceRounds {
		return Placement{}, errKeepsMoving(k, round)
	}
	sess, err := p.current(ctx, k)
	if err != nil {
		return Placement{}, err
	}
	return p.place(ctx, sess, hasLocalQueue, round+1)
}

// lostTakeover answers an attach whose takeover lost the race: the
// assignment is no longer the one this attach read, so another attach took
// the session over first. It records no fallback event and drops nothing:
// that was the winner's to do. A healthy winner elsewhere gets
// wrong_instance whatever the grace window says (the window belonged to the
// previous attachment; re-deciding on it would take the session straight
// back from the winner). A winner on this instance (two attaches raced here)
// means the reset already happened: this attach says so too. Anything else
// (the winner is already unhealthy, or the assignment went back) is decided
// again as Place would.
func (p *Placer) lostTakeover(ctx context.Context, k sessionstore.Key, hasLocalQueue bool, round int) (Placement, error) {
	sess, err := p.current(ctx, k)
	if err != nil {
		return Placement{}, err
	}
	switch a := sess.AssignedInstance; {
	case a == p.self:
		return Placement{AffinityReset: true}, nil
	case a != "" && p.members.confirmHealthy(ctx, a):
		p.log.Info("sticky takeover lost to another instance", "session_id", k.SessionID,
			"tenant_id", k.TenantID, "project_id", k.ProjectID, "winner", a)
		return Placement{}, p.wrongInstance(ctx, k.SessionID, a)
	case round >= maxPlaceRounds:
		return Placement{}, errKeepsMoving(k, round)
	default:
		return p.place(ctx, sess, hasLocalQueue, round+1)
	}
}

// takeOver moves sess's assignment to this instance, if it is still the one
// sess carries, and records why. Only the attach that moved it records the
// fallback event and applies the drop policy.
func (p *Placer) takeOver(ctx context.Context, sess sessionstore.Session, reason string, hasLocalQueue bool, round int) (Placement, error) {
	now := p.now()
	moved, err := p.reassign(ctx, sess.Key, sess.AssignedInstance)
	if err != nil {
		return Placement{}, err
	}
	if !moved {
		return p.lostTakeover(ctx, sess.Key, hasLocalQueue, round)
	}
	out := Placement{AffinityReset: true}
	if p.cfg.DisconnectPolicy == PolicyDrop {
		n, err := p.store.DropPending(ctx, sess.Key, now)
		if err != nil {
			return Placement{}, fmt.Errorf("drop pending at affinity reset: %w", err)
		}
		p.m.signalsDropped.WithLabelValues("affinity_reset").Add(float64(n))
		out.Dropped = &n
	}
	counter, metric := sessionstore.CounterFallbacks, p.m.fallbacks
	if reason == ReasonGraceExpired {
		counter, metric = sessionstore.CounterReassignments, p.m.reassignments
	}
	err = p.store.RecordFallback(ctx, sessionstore.FallbackEvent{
		Key: sess.Key, FromInstance: sess.AssignedInstance, ToInstance: p.self,
		RuntimeMode: sess.RuntimeMode, RuntimeModeSource: sess.RuntimeModeSource,
		Reason: reason, At: now, Counter: counter,
	})
	if err != nil {
		return Placement{}, fmt.Errorf("record fallback: %w", err)
	}
	metric.Inc()
	dropped := 0
	if out.Dropped != nil {
		dropped = *out.Dropped
	}
	p.log.Info("sticky session taken over", "session_id", sess.SessionID, "tenant_id", sess.TenantID,
		"project_id", sess.ProjectID, "from_instance", sess.AssignedInstance, "reason", reason,
		"runtime_mode_source", sess.RuntimeModeSource, "dropped", dropped)
	return out, nil
}

// Assign picks the instance a new sticky session of tenant/project is placed
// on. By the fewest sticky sessions (StickyByLoad): the healthy instance with
// the fewest live sticky sessions assigned to it. By project
// (StickyByProject): the healthy instance where most of the project's live
// sessions are (attached there, or assigned there and not attached yet),
// which is the project's instance behind a balancer that hashes on the
// project; by the fewest when none is on a healthy instance. Ties go to the
// fewest sticky sessions, then to this instance, then to the lowest id. The
// store is read at each call, so concurrent registrations on several
// instances see each other's assignments.
func (p *Placer) Assign(ctx context.Context, tenantID, projectID string) (string, error) {
	if err := p.members.ensureLoaded(ctx); err != nil {
		return "", err
	}
	stats, err := p.store.SessionStats(ctx, p.now())
	if err != nil {
		return "", fmt.Errorf("assign: %w", err)
	}
	if p.cfg.Placement.Sticky == StickyByProject {
		home, err := p.projectHome(ctx, tenantID, projectID, stats.ByAssignedInstance)
		if err != nil || home != "" {
			return home, err
		}
	}
	return p.leastLoaded(ctx, stats.ByAssignedInstance), nil
}

// projectSample bounds how many of a project's sessions Assign reads to find
// where the project is: enough to see where most of it is.
const projectSample = 256

// projectHome is the healthy instance where most of the project's live
// sessions are, or "" when none of them is on a healthy instance.
func (p *Placer) projectHome(ctx context.Context, tenantID, projectID string, load map[string]int) (string, error) {
	f := sessionstore.SessionFilter{TenantID: tenantID, ProjectID: projectID, Limit: projectSample}
	sessions, err := p.store.ListSessions(ctx, f, p.now())
	if err != nil {
		return "", fmt.Errorf("assign: the project's sessions: %w", err)
	}
	count := map[string]int{}
	for _, s := range sessions {
		at := s.QueueInstance
		if at == "" {
			at = s.AssignedInstance
		}
		if at != "" {
			count[at]++
		}
	}
	best := ""
	for _, id := range sortedKeys(count) {
		if !p.members.Healthy(ctx, id) {
			continue
		}
		if best == "" || count[id] > count[best] || count[id] == count[best] && p.lighter(id, best, load) {
			best = id
		}
	}
	return best, nil
}

// leastLoaded is the healthy instance with the fewest sticky sessions (load),
// or this instance when none is healthy, this one included (it is draining
// and the caller let a registration through).
func (p *Placer) leastLoaded(ctx context.Context, load map[string]int) string {
	best := ""
	if p.members.Healthy(ctx, p.self) {
		best = p.self
	}
	for _, id := range p.members.healthyOthers(ctx) {
		if best == "" || p.lighter(id, best, load) {
			best = id
		}
	}
	if best == "" {
		best = p.self
	}
	return best
}

// lighter reports whether instance a is to be preferred to b: fewer sticky
// sessions, else this instance, else the lower id.
func (p *Placer) lighter(a, b string, load map[string]int) bool {
	switch {
	case load[a] != load[b]:
		return load[a] < load[b]
	case a == p.self || b == p.self:
		return a == p.self
	default:
		return a < b
	}
}
