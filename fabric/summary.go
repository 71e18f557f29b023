package fabric

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// SummaryFallbackLimit is how many fallback events the summary shows, newest first.
const SummaryFallbackLimit = 50

// InstanceStatus is one instance in the summary.
type InstanceStatus struct {
	ID      string
	URL     string
	Healthy bool
	// Draining is the instance's own mark (SetDraining).
	Draining bool
	// Process is what the probe sees of the instance's process:
	// ProcessConnected, ProcessGone (dead at once) or ProcessUnknown.
	Process string
	// Sessions is how many live sticky sessions are assigned to it (the load
	// placement balances).
	Sessions int
	// AttachedQueues is how many live sessions the store records as having
	// their queue on it; on an unhealthy instance those queues are gone.
	AttachedQueues  int
	LastHeartbeatAt time.Time
}

// Summary is the operator's view of the fabric (GET /v1/ops/fabric/summary).
type Summary struct {
	Gate      string
	Allowlist []string
	Sessions  sessionstore.SessionStats
	Instances []InstanceStatus
	Counts    sessionstore.Counts
	Fallbacks []sessionstore.FallbackEvent
}

// Summary reads the fabric's state from the store: the instance table as it
// is now (not the cached view), the live sessions, the cluster-wide counters
// and the newest fallback events. Errors are wrapped store errors.
func (f *Fabric) Summary(ctx context.Context) (Summary, error) {
	now := f.now()
	list, err := f.store.ListInstances(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("summary: %w", err)
	}
	stats, err := f.store.SessionStats(ctx, now)
	if err != nil {
		return Summary{}, fmt.Errorf("summary: %w", err)
	}
	counts, err := f.store.Counts(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("summary: %w", err)
	}
	events, err := f.store.ListFallbacks(ctx, SummaryFallbackLimit)
	if err != nil {
		return Summary{}, fmt.Errorf("summary: %w", err)
	}
	f.checkRollback(counts)
	out := Summary{
		Gate: f.Gate(), Allowlist: f.Allowlist(), Sessions: stats, Counts: counts, Fallbacks: events,
		Instances: make([]InstanceStatus, 0, len(list)),
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, in := range list {
		out.Instances = append(out.Instances, InstanceStatus{
			ID: in.ID, URL: in.URL, Healthy: f.healthyAt(in, now), Draining: in.Draining,
			Process:  f.processState(in.ID, in.StartedAt),
			Sessions: stats.ByAssignedInstance[in.ID], AttachedQueues: stats.ByQueueInstance[in.ID],
			LastHeartbeatAt: in.LastHeartbeatAt,
		})
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
