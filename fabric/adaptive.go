package fabric

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Adaptive gate states, as the fabric summary shows them.
const (
	GateOff        = "off"
	GateOn         = "on"
	GateRolledBack = "rolled_back"
)

// canaryStore is what Canary needs of the store.
type canaryStore interface {
	AddCount(ctx context.Context, c sessionstore.Counter, n int64) error
	Counts(ctx context.Context) (sessionstore.Counts, error)
}

// Canary is the fabric's adaptive canary: the gate that lets the adaptive
// classifier place new sessions of allowlisted clients, and rolls it back
// once the cluster-wide count of placement mismatches reaches
// RollbackAfter. It is safe for concurrent use.
type Canary struct {
	cfg        PlacementConfig
	store      canaryStore
	log        *slog.Logger
	m          *metrics
	rolledBack atomic.Bool
}

func newCanary(cfg PlacementConfig, d Deps, m *metrics) *Canary {
	return &Canary{cfg: cfg, store: d.Store, log: d.Logger, m: m}
}

// Refresh reads the cluster-wide counters and rolls the gate back when
// they say so. Fabric.Tick calls it. It reads nothing when the gate cannot
// roll back: RollbackAfter is 0 (the default), or it already has.
func (c *Canary) Refresh(ctx context.Context) error {
	if c.cfg.RollbackAfter <= 0 || c.rolledBack.Load() {
		return nil
	}
	counts, err := c.store.Counts(ctx)
	if err != nil {
		return fmt.Errorf("counts: %w", err)
	}
	c.checkRollback(counts)
	return nil
}

// Gate is the adaptive placement gate: off (MARCONI_ADAPTIVE_PLACEMENT=off),
// on, or rolled_back (on, but the mismatch count reached RollbackAfter).
func (c *Canary) Gate() string {
	switch {
	case !c.cfg.Adaptive:
		return GateOff
	case c.rolledBack.Load():
		return GateRolledBack
	default:
		return GateOn
	}
}

// Allowlist is MARCONI_ADAPTIVE_CLIENTS, never nil.
func (c *Canary) Allowlist() []string {
	if c.cfg.AdaptiveClients == nil {
		return []string{}
	}
	return slices.Clone(c.cfg.AdaptiveClients)
}

// Open implements AdaptiveGate: the gate is on (not rolled back) and
// clientID is on the allowlist.
func (c *Canary) Open(clientID string) bool {
	return c.Gate() == GateOn && allowlisted(c.cfg.AdaptiveClients, clientID)
}

// RuntimeMode resolves a new session's mode and source. Only a new session
// comes here: a resume keeps its stored mode and source.
func (c *Canary) RuntimeMode(explicit Mode, clientID string, h Hints) (Mode, ModeSource) {
	return ResolveMode(explicit, clientID, h, c, c.cfg.DefaultMode)
}

// CountAdaptivePlacement counts a session placed by the classifier, in the
// store (cluster-wide) and in this instance's metric. A store failure is
// logged: the session is already registered.
func (c *Canary) CountAdaptivePlacement(ctx context.Context) {
	c.m.adaptivePlacements.Inc()
	if err := c.store.AddCount(ctx, sessionstore.CounterAdaptivePlacements, 1); err != nil {
		c.log.Warn("count adaptive placement", "err", err)
	}
}

// ReportMismatch records that sess, placed by the classifier, needed
// runtime-local state: a placement-quality failure and a rollback signal.
// Every report counts. Errors: not_adaptive_placement when the classifier
// did not place sess, or a wrapped store error.
func (c *Canary) ReportMismatch(ctx context.Context, sess sessionstore.Session, reason string) error {
	if sess.RuntimeModeSource != SourceAdaptive {
		return marconi.Errorf(marconi.CodeNotAdaptivePlacement,
			"session %q was not placed by the adaptive classifier (runtime_mode_source %q)", sess.SessionID, sess.RuntimeModeSource)
	}
	if err := c.store.AddCount(ctx, sessionstore.CounterAdaptivePlacementMismatches, 1); err != nil {
		return fmt.Errorf("count adaptive placement mismatch: %w", err)
	}
	c.m.mismatches.Inc()
	c.log.Warn("adaptive placement mismatch", "session_id", sess.SessionID, "tenant_id", sess.TenantID,
		"project_id", sess.ProjectID, "client_id", sess.ClientID, "runtime_mode", sess.RuntimeMode, "reason", reason)
	if c.cfg.RollbackAfter > 0 {
		counts, err := c.store.Counts(ctx)
		if err != nil {
			// Counted; the next tick reads the counters again.
			c.log.Warn("read counters after a mismatch", "err", err)
			return nil
		}
		c.checkRollback(counts)
	}
	return nil
}

// checkRollback rolls the gate back once the cluster-wide mismatch count
// reaches RollbackAfter. The rollback lasts for the life of the process: the
// count never goes down, so an operator who wants the classifier back raises
// MARCONI_ADAPTIVE_ROLLBACK_AFTER (or sets it to 0) and restarts.
func (c *Canary) checkRollback(counts sessionstore.Counts) {
	after := c.cfg.RollbackAfter
	if after <= 0 || counts.AdaptivePlacementMismatches < after {
		return
	}
	if c.rolledBack.CompareAndSwap(false, true) {
		c.m.rolledBack.Set(1)
		c.log.Warn("adaptive placement rolled back: the classifier places no more sessions",
			"mismatches", counts.AdaptivePlacementMismatches, "rollback_after", after)
	}
}
