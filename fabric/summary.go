package fabric

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// SummaryFallbackLimit is how many fallback events the summary shows, newest first.
const SummaryFallbackLimit = 50

// SummaryClientLimit is how many client ids the canary view shows, most
// placements first.
const SummaryClientLimit = 50

// ClientPlacements is one client_id in the canary view: the live sessions
// the adaptive classifier placed for it, by runtime mode, and whether the
// client is on MARCONI_ADAPTIVE_CLIENTS now (one that is not was placed under
// an earlier allowlist, or the allowlist is not what the operator meant).
type ClientPlacements struct {
	ClientID    string
	Sessions    int
	ByMode      map[Mode]int
	OnAllowlist bool
}

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
	// BusKeyVersion is the version of the bus key the instance sealed
	// with at its last heartbeat; 0 is unknown (not read yet, an instance
	// of an older release, a store without a bus key).
	BusKeyVersion int64
}

// Summary is the operator's view of the fabric (GET /v1/ops/fabric/summary).
type Summary struct {
	Gate      string
	Allowlist []string
	// ByClient is the canary view: adaptive placements of the live sessions
	// by client_id, most first, at most SummaryClientLimit.
	ByClient  []ClientPlacements
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
	byClient, err := f.store.CountByClient(ctx, now, SourceAdaptive)
	if err != nil {
		return Summary{}, fmt.Errorf("summary: %w", err)
	}
	f.Canary.checkRollback(counts)
	out := Summary{
		Gate: f.Canary.Gate(), Allowlist: f.Canary.Allowlist(), ByClient: f.Canary.canaryView(byClient),
		Sessions: stats, Counts: counts, Fallbacks: events,
		Instances: make([]InstanceStatus, 0, len(list)),
	}
	mem := f.Members
	mem.fresh(ctx)
	mem.mu.RLock()
	defer mem.mu.RUnlock()
	for _, in := range list {
		out.Instances = append(out.Instances, InstanceStatus{
			ID: in.ID, URL: in.URL, Healthy: mem.healthyAt(in, now), Draining: in.Draining,
			Process:  mem.processState(in.ID, in.StartedAt),
			Sessions: stats.ByAssignedInstance[in.ID], AttachedQueues: stats.ByQueueInstance[in.ID],
			LastHeartbeatAt: in.LastHeartbeatAt, BusKeyVersion: in.BusKeyVersion,
		})
	}
	return out, nil
}

// canaryView orders the adaptive placements by client, most first (ties by
// id), and keeps the first SummaryClientLimit.
func (c *Canary) canaryView(byClient map[string]map[Mode]int) []ClientPlacements {
	out := make([]ClientPlacements, 0, len(byClient))
	for id, modes := range byClient {
		n := 0
		for _, c := range modes {
			n += c
		}
		out = append(out, ClientPlacements{ClientID: id, Sessions: n, ByMode: modes,
			OnAllowlist: allowlisted(c.cfg.AdaptiveClients, id)})
	}
	slices.SortFunc(out, func(a, b ClientPlacements) int {
		if a.Sessions != b.Sessions {
			return b.Sessions - a.Sessions
		}
		return strings.Compare(a.ClientID, b.ClientID)
	})
	return out[:min(len(out), SummaryClientLimit)]
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
