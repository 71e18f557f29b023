package fabric

import (
	"context"
	"fmt"
	"time"
)

// Prober tells which instances' processes are alive now, from what the store
// sees of their connections (pgstore.Bus: the liveness lock that each
// process's two dedicated connections hold, so that one of them replaced
// is no death). Implementations are safe for concurrent use.
type Prober interface {
	// ConnectedInstances returns, by instance id, the StartedAt of the
	// process that holds its connection now (one of the instance table's
	// current processes, never an earlier process of the same id), and
	// names the server that answered: a connection seen on one server says
	// nothing of the next (a failover).
	ConnectedInstances(ctx context.Context) (live map[string]time.Time, server string, err error)
}

// Process states of an instance in the summary.
const (
	ProcessConnected = "connected" // its connection is there now
	ProcessGone      = "gone"      // it was seen connected, and its connection ended: dead
	ProcessUnknown   = "unknown"   // no probe, or not yet seen connected: the heartbeat judges
)

// Probe asks the prober which processes are connected and updates the
// health view: an instance whose current process (its StartedAt) was seen
// connected and is connected no more is dead at once, whatever its
// heartbeat's age. An instance whose current process was never seen
// connected (an older binary, a listener not yet connected, a process
// restarted with the same id) is judged by its heartbeat only: a connection
// is credited to the process the prober names, never to the StartedAt
// this view holds, which may be another process's.
// Fabric.Run calls it every ProbeEvery while the view is read or an
// instance is still to be seen connected (runProbe), and a decision calls
// it when no probe was tried within ProbeEvery (fresh); it does nothing
// without a prober.
//
// A connection seen on one server says nothing of the next: when the
// prober answers from another server (the database failed over or
// restarted), every instance is judged by its heartbeat again until it is
// seen connected there, so an instance whose listener has not yet reconnected
// is not declared dead.
func (m *Members) Probe(ctx context.Context) error {
	if m.prober == nil {
		return nil
	}
	live, server, err := m.prober.ConnectedInstances(ctx)
	if err != nil {
		return fmt.Errorf("probe instances: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if server != m.probeServer {
		clear(m.seenConnected)
		clear(m.gone)
		m.probeServer = server
	}
	m.lastProbe = time.Now()          // wall time: it only spaces the probes
	for id := range m.seenConnected { // forget instances pruned from the table
		if _, ok := m.instances[id]; !ok {
			delete(m.seenConnected, id)
			delete(m.gone, id)
		}
	}
	for id, in := range m.instances {
		if id == m.cfg.InstanceID {
			continue
		}
		started, held := live[id]
		if held {
			m.seenConnected[id] = started
		}
		gone := !in.StartedAt.IsZero() && m.seenConnected[id].Equal(in.StartedAt) && !(held && started.Equal(in.StartedAt))
		if gone && !m.gone[id] {
			m.log.Warn("instance's process is gone (its connection to Postgres ended); its queues count as absent",
				"instance", id, "url", in.URL)
		}
		m.gone[id] = gone
	}
	return nil
}

// minProbeGap bounds how often confirmHealthy probes beyond Run's schedule.
const minProbeGap = 100 * time.Millisecond

// confirmHealthy is Healthy after a probe, unless one ran within
// minProbeGap: an attach is about to be sent to instance (wrong_instance),
// and a process killed since the last scheduled probe must not be named.
// A failed probe leaves the view as it was.
func (m *Members) confirmHealthy(ctx context.Context, instance string) bool {
	if !m.Healthy(ctx, instance) {
		return false
	}
	if m.prober == nil {
		return true
	}
	// One probe at a time: concurrent attaches wait for it and use its view.
	m.probeMu.Lock()
	m.mu.RLock()
	stale := time.Since(m.lastProbe) >= minProbeGap
	m.mu.RUnlock()
	if stale {
		m.noteProbeTried()
		if err := m.Probe(ctx); err != nil {
			m.log.Debug("probe before wrong_instance", "instance", instance, "err", err)
		}
	}
	m.probeMu.Unlock()
	return m.Healthy(ctx, instance)
}

// processState is what the fabric knows of instance's process; the caller
// holds m.mu.
func (m *Members) processState(id string, startedAt time.Time) string {
	switch {
	case id == m.cfg.InstanceID:
		return ProcessConnected
	case m.prober == nil:
		return ProcessUnknown
	case m.gone[id]:
		return ProcessGone
	case m.seenConnected[id].Equal(startedAt) && !startedAt.IsZero():
		return ProcessConnected
	}
	return ProcessUnknown
}

// runProbe calls Probe every ProbeEvery until ctx ends, when a decision
// read the view since the last tick (fresh) or an instance's process is
// still to be seen connected (unseen); otherwise the tick costs no store
// call: an instance that decides nothing about the others (idle, or all its
// traffic its own) does not probe, and the first decision after such a
// pause probes before it reads (fresh).
func (m *Members) runProbe(ctx context.Context) {
	t := time.NewTicker(m.cfg.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !m.demand.Swap(false) && !m.unseen() {
			continue
		}
		m.probeMu.Lock()
		m.noteProbeTried()
		err := m.Probe(ctx)
		m.probeMu.Unlock()
		if err != nil && ctx.Err() == nil {
			m.log.Debug("fabric probe", "err", err)
		}
	}
}

// fresh is called before a decision reads another instance's health: it
// reads the instance table when no tick has yet (ensureLoaded: a process
// just started serves before its first tick, and an empty view holds no
// live peer), notes the demand, so that runProbe keeps probing while
// decisions are made, and when no probe ran or was tried within ProbeEvery
// (runProbe skipped them: nobody asked) it probes now, or waits for the
// probe that started meanwhile, so that a decision after a pause never
// reads a liveness older than a probe interval. A decision made while a probe is
// under way does not wait for it: it reads the view as it stands, as it
// always could. A probe that failed is not tried again within ProbeEvery,
// so a failing store slows one decision per interval, not each, and a
// failed probe leaves the view as it was.
func (m *Members) fresh(ctx context.Context) {
	if err := m.ensureLoaded(ctx); err != nil {
		// The view stays empty until a read or a tick succeeds.
		m.log.Debug("first read of the instance table before a decision", "err", err)
	}
	if m.prober == nil {
		return
	}
	// Whether a probe is due is read before the demand is noted: a probe
	// that the demand starts elsewhere then finds this decision waiting.
	due := m.probeDue()
	if !m.demand.Load() {
		m.demand.Store(true)
	}
	if !due {
		return
	}
	m.probeMu.Lock()
	defer m.probeMu.Unlock()
	if !m.probeDue() {
		return
	}
	m.noteProbeTried()
	if err := m.Probe(ctx); err != nil {
		m.log.Debug("probe before a decision", "err", err)
	}
}

// probeDue reports whether no probe succeeded, nor was tried, within
// ProbeEvery.
func (m *Members) probeDue() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return time.Since(m.lastProbe) >= m.cfg.ProbeEvery && time.Since(m.probeTried) >= m.cfg.ProbeEvery
}

// noteProbeTried records that a probe starts now; the caller holds probeMu.
func (m *Members) noteProbeTried() {
	m.mu.Lock()
	m.probeTried = time.Now() // wall time: it only spaces the probes
	m.mu.Unlock()
}

// unseen reports whether the view holds another instance, healthy by its
// heartbeat, whose current process has not been seen connected on the
// current server: until a probe sees it connected, its death could not be
// told from its connection, so runProbe and Tick keep probing for it.
func (m *Members) unseen() bool {
	if m.prober == nil {
		return false
	}
	now := m.now()
	m.mu.RLock()
	defer m.mu.RUnlock()
	for id, in := range m.instances {
		if id != m.cfg.InstanceID && !in.StartedAt.IsZero() &&
			!m.seenConnected[id].Equal(in.StartedAt) && m.healthyAt(in, now) {
			return true
		}
	}
	return false
}

// outage is a span during which this instance could not read the instance
// table: the store was down or failing over, so no instance could
// heartbeat either, and a heartbeat's age does not count it.
type outage struct {
	since time.Time // the last successful read before it; zero: none yet
	end   time.Time // the first successful read after it; zero while it lasts
}

// readFailed notes that the instance table could not be read: an outage
// starts, unless one is going on or nothing was ever read.
func (m *Members) readFailed() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loaded.Load() && (m.outage.since.IsZero() || !m.outage.end.IsZero()) {
		m.outage = outage{since: m.lastRead}
	}
}

// readSucceeded notes a successful read: an outage going on ends. The
// caller holds m.mu.
func (m *Members) readSucceeded() {
	m.lastRead = m.now()
	if !m.outage.since.IsZero() && m.outage.end.IsZero() {
		m.outage.end = m.lastRead
	}
}

// heartbeatAge is how old a heartbeat sent at hb is at now, not counting
// the latest outage: while it lasts, ages are frozen as of the last read;
// after it, they resume where they stood, so that an instance alive
// throughout has its DeadAfter window, less what it had used, to heartbeat
// again, and one that died during the outage is dead within that window.
// The caller holds m.mu.
func (m *Members) heartbeatAge(hb, now time.Time) time.Duration {
	o := m.outage
	switch {
	case o.since.IsZero():
		return now.Sub(hb)
	case o.end.IsZero():
		return o.since.Sub(hb)
	case hb.Before(o.since):
		return now.Sub(hb) - o.end.Sub(o.since)
	case hb.Before(o.end):
		return now.Sub(o.end)
	}
	return now.Sub(hb)
}
