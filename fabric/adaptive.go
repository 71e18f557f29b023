package fabric

import (
	"context"
	"fmt"
	"slices"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Adaptive gate states, as the fabric summary shows them.
const (
	GateOff        = "off"
	GateOn         = "on"
	GateRolledBack = "rolled_back"
)

// Gate is the adaptive placement gate: off (MARCONI_ADAPTIVE_PLACEMENT=off),
// on, or rolled_back (on, but the mismatch count reached RollbackAfter).
func (f *Fabric) Gate() string {
	switch {
	case !f.cfg.Placement.Adaptive:
		return GateOff
	case f.rolledBack.Load():
		return GateRolledBack
	default:
		return GateOn
	}
}

// Allowlist is MARCONI_ADAPTIVE_CLIENTS, never nil.
func (f *Fabric) Allowlist() []string {
	if f.cfg.Placement.AdaptiveClients == nil {
		return []string{}
	}
	return slices.Clone(f.cfg.Placement.AdaptiveClients)
}

// Open implements AdaptiveGate: the gate is on (not rolled back) and
// clientID is on the allowlist.
func (f *Fabric) Open(clientID string) bool {
	return f.Gate() == GateOn && allowlisted(f.cfg.Placement.AdaptiveClients, clientID)
}

// RuntimeMode resolves a new session's mode and source. Only a new session
// comes here: a resume keeps its stored mode and source.
func (f *Fabric) RuntimeMode(explicit Mode, clientID string, h Hints) (Mode, ModeSource) {
	return ResolveMode(explicit, clientID, h, f, f.cfg.Placement.DefaultMode)
}

// CountAdaptivePlacement counts a session placed by the classifier, in the
// store (cluster-wide) and in this instance's metric. A store failure is
// logged: the session is already registered.
func (f *Fabric) CountAdaptivePlacement(ctx context.Context) {
	f.m.adaptivePlacements.Inc()
	if err := f.store.AddCount(ctx, sessionstore.CounterAdaptivePlacements, 1); err != nil {
		f.log.Warn("count adaptive placement", "err", err)
	}
}

// ReportMismatch records that sess, placed by the classifier, needed
// runtime-local state: a placement-quality failure and a rollback signal.
// Every report counts. Errors: not_adaptive_placement when the classifier
// did not place sess, or a wrapped store error.
func (f *Fabric) ReportMismatch(ctx context.Context, sess sessionstore.Session, reason string) error {
	if ModeSource(sess.RuntimeModeSource) != SourceAdaptive {
		return marconi.Errorf(marconi.CodeNotAdaptivePlacement,
			"session %q was not placed by the adaptive classifier (runtime_mode_source %q)", sess.SessionID, sess.RuntimeModeSource)
	}
	if err := f.store.AddCount(ctx, sessionstore.CounterAdaptivePlacementMismatches, 1); err != nil {
		return fmt.Errorf("count adaptive placement mismatch: %w", err)
	}
	f.m.mismatches.Inc()
	f.log.Warn("adaptive placement mismatch", "session_id", sess.SessionID, "tenant_id", sess.TenantID,
		"project_id", sess.ProjectID, "client_id", sess.ClientID, "runtime_mode", sess.RuntimeMode, "reason", reason)
	if f.cfg.Placement.RollbackAfter > 0 {
		c, err := f.store.Counts(ctx)
		if err != nil {
			// Counted; the next tick reads the counters again.
			f.log.Warn("read counters after a mismatch", "err", err)
			return nil
		}
		f.checkRollback(c)
	}
	return nil
}

// checkRollback rolls the gate back once the cluster-wide mismatch count
// reaches RollbackAfter. The rollback lasts for the life of the process: the
// count never goes down, so an operator who wants the classifier back raises
// MARCONI_ADAPTIVE_ROLLBACK_AFTER (or sets it to 0) and restarts.
func (f *Fabric) checkRollback(c sessionstore.Counts) {
	after := f.cfg.Placement.RollbackAfter
	if after <= 0 || c.AdaptivePlacementMismatches < after {
		return
	}
	if f.rolledBack.CompareAndSwap(false, true) {
		f.m.rolledBack.Set(1)
		f.log.Warn("adaptive placement rolled back: the classifier places no more sessions",
			"mismatches", c.AdaptivePlacementMismatches, "rollback_after", after)
	}
}
