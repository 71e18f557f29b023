package fabric

import (
	"context"
	"fmt"
	"time"
)

// Prober tells which instances' processes are alive now, from what the store
// sees of their connections (pgstore.Bus: the liveness lock each instance's
// listener connection holds). Implementations are safe for concurrent use.
type Prober interface {
	// ConnectedInstances returns the ids of the instances whose process
	// holds its connection now, and which server holds those connections:
	// an identity that changes when the database fails over or restarts,
	// since every connection is lost then.
	ConnectedInstances(ctx context.Context) (live map[string]bool, server string, err error)
}

// Process states of an instance in the summary.
const (
	ProcessConnected = "connected" // its connection is there now
	ProcessGone      = "gone"      // it was seen connected, and its connection ended: dead
	ProcessUnknown   = "unknown"   // no probe, or not yet seen connected: the heartbeat judges
)

// SetProber sets the prober that Probe asks; nil (the default) leaves
// health to the heartbeat alone. Call it before the fabric is used.
func (f *Fabric) SetProber(p Prober) { f.prober = p }

// Probe asks the prober which instances are connected and updates the
// health view: an instance whose current process (its StartedAt) was seen
// connected and is connected no more is dead at once, whatever its
// heartbeat's age. An instance never seen connected (an older binary, one
// whose listener has not yet connected) is judged by its heartbeat only.
// Run calls it every ProbeEvery; it does nothing without a prober.
//
// A connection seen on one server says nothing of the next: when the
// prober answers from another server (the database failed over or
// restarted), every instance is judged by its heartbeat again until it is
// seen connected there, so an instance whose listener has not yet reconnected
// is not declared dead.
func (f *Fabric) Probe(ctx context.Context) error {
	if f.prober == nil {
		return nil
	}
	live, server, err := f.prober.ConnectedInstances(ctx)
	if err != nil {
		return fmt.Errorf("probe instances: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if server != f.probeServer {
		clear(f.seenConnected)
		clear(f.gone)
		f.probeServer = server
	}
	f.lastProbe = time.Now()          // wall time: it only spaces the probes
	for id := range f.seenConnected { // forget instances pruned from the table
		if _, ok := f.instances[id]; !ok {
			delete(f.seenConnected, id)
			delete(f.gone, id)
		}
	}
	for id, in := range f.instances {
		if id == f.cfg.InstanceID {
			continue
		}
		switch seen, ok := f.seenConnected[id]; {
		case live[id]:
			f.seenConnected[id] = in.StartedAt
		case ok && seen.Equal(in.StartedAt) && !f.gone[id]:
			f.log.Warn("instance's process is gone (its connection to Postgres ended); its queues count as absent",
				"instance", id, "url", in.URL)
		}
		f.gone[id] = !live[id] && f.seenConnected[id].Equal(in.StartedAt) && !in.StartedAt.IsZero()
	}
	return nil
}

// minProbeGap bounds how often confirmHealthy probes beyond Run's schedule.
const minProbeGap = 100 * time.Millisecond

// confirmHealthy is Healthy after a probe, unless one ran within
// minProbeGap: an attach is about to be sent to instance (wrong_instance),
// and a process killed since the last scheduled probe must not be named.
// A failed probe leaves the view as it was.
func (f *Fabric) confirmHealthy(ctx context.Context, instance string) bool {
	if !f.Healthy(ctx, instance) {
		return false
	}
	if f.prober == nil {
		return true
	}
	// One probe at a time: concurrent attaches wait for it and use its view.
	f.probeMu.Lock()
	f.mu.RLock()
	stale := time.Since(f.lastProbe) >= minProbeGap
	f.mu.RUnlock()
	if stale {
		if err := f.Probe(ctx); err != nil {
			f.log.Debug("probe before wrong_instance", "instance", instance, "err", err)
		}
	}
	f.probeMu.Unlock()
	return f.Healthy(ctx, instance)
}

// processState is what the fabric knows of instance's process; the caller
// holds f.mu.
func (f *Fabric) processState(id string, startedAt time.Time) string {
	switch {
	case id == f.cfg.InstanceID:
		return ProcessConnected
	case f.prober == nil:
		return ProcessUnknown
	case f.gone[id]:
		return ProcessGone
	case f.seenConnected[id].Equal(startedAt) && !startedAt.IsZero():
		return ProcessConnected
	}
	return ProcessUnknown
}

// runProbe calls Probe every ProbeEvery until ctx ends.
func (f *Fabric) runProbe(ctx context.Context) {
	t := time.NewTicker(f.cfg.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := f.Probe(ctx); err != nil && ctx.Err() == nil {
			f.log.Debug("fabric probe", "err", err)
		}
	}
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
func (f *Fabric) readFailed() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loaded && (f.outage.since.IsZero() || !f.outage.end.IsZero()) {
		f.outage = outage{since: f.lastRead}
	}
}

// readSucceeded notes a successful read: an outage going on ends. The
// caller holds f.mu.
func (f *Fabric) readSucceeded() {
	f.lastRead = f.now()
	if !f.outage.since.IsZero() && f.outage.end.IsZero() {
		f.outage.end = f.lastRead
	}
}

// heartbeatAge is how old a heartbeat sent at hb is at now, not counting
// the latest outage: while it lasts, ages are frozen as of the last read;
// after it, they resume where they stood, so that an instance alive
// throughout has its DeadAfter window, less what it had used, to heartbeat
// again, and one that died during the outage is dead within that window.
// The caller holds f.mu.
func (f *Fabric) heartbeatAge(hb, now time.Time) time.Duration {
	o := f.outage
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
