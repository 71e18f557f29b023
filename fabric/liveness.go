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
