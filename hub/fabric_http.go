package hub

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/signals"
)

// mismatchReasonLimit bounds the reason of a placement-mismatch report.
const mismatchReasonLimit = 1024

type mismatchRequest struct {
	Reason string `json:"reason"`
}

// placementMismatch is POST /v1/placement-mismatch: a session the adaptive
// classifier placed reports that it needed runtime-local state. 204, or 409
// not_adaptive_placement for any other session.
func (s *Server) placementMismatch(c echo.Context) error {
	sess := session(c)
	var req mismatchRequest
	if err := decodeBody(c, 4<<10, &req); err != nil {
		return err
	}
	if !signals.ValidText(req.Reason, mismatchReasonLimit) {
		return marconi.Errorf(marconi.CodeInvalidField, "reason must be UTF-8 text of at most %d bytes without control characters", mismatchReasonLimit)
	}
	if err := s.fabric.Canary.ReportMismatch(c.Request().Context(), sess, req.Reason); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

type fabricSummaryJSON struct {
	AdaptivePlacement struct {
		Gate      string                `json:"gate"`
		Allowlist []string              `json:"allowlist"`
		ByClient  []clientPlacementJSON `json:"by_client"`
	} `json:"adaptive_placement"`
	Sessions struct {
		Total    int                         `json:"total"`
		ByMode   map[marconi.RuntimeMode]int `json:"by_mode"`
		BySource map[marconi.ModeSource]int  `json:"by_source"`
	} `json:"sessions"`
	Instances []FabricInstance `json:"instances"`
	Summary   struct {
		TotalFallbacks                   int64 `json:"total_fallbacks"`
		TotalReassignments               int64 `json:"total_reassignments"`
		TotalAdaptivePlacements          int64 `json:"total_adaptive_placements"`
		TotalAdaptivePlacementMismatches int64 `json:"total_adaptive_placement_mismatches"`
	} `json:"summary"`
	FallbackEvents []fallbackEventJSON `json:"fallback_events"`
}

type clientPlacementJSON struct {
	ClientID    string                      `json:"client_id"`
	Sessions    int                         `json:"sessions"`
	ByMode      map[marconi.RuntimeMode]int `json:"by_mode"`
	OnAllowlist bool                        `json:"on_allowlist"`
}

// FabricInstance is one instance of the fabric summary
// (GET /v1/ops/fabric/summary, docs/api.md), as the hub writes it and
// `marconi fabric` reads it.
type FabricInstance struct {
	InstanceID      string    `json:"instance_id"`
	URL             string    `json:"url"`
	Healthy         bool      `json:"healthy"`
	Draining        bool      `json:"draining"`
	Process         string    `json:"process"`
	Sessions        int       `json:"sessions"`
	AttachedQueues  int       `json:"attached_queues"`
	LastHeartbeatAt time.Time `json:"last_heartbeat_at"`
	// BusKeyVersion is null when unknown (fabric.InstanceStatus).
	BusKeyVersion *int64 `json:"bus_key_version"`
}

type fallbackEventJSON struct {
	SessionID         string              `json:"session_id"`
	FromInstance      string              `json:"from_instance"`
	ToInstance        string              `json:"to_instance"`
	RuntimeMode       marconi.RuntimeMode `json:"runtime_mode"`
	RuntimeModeSource marconi.ModeSource  `json:"runtime_mode_source"`
	Reason            string              `json:"reason"`
	At                time.Time           `json:"at"`
}

// fabricSummary is GET /v1/ops/fabric/summary.
func (s *Server) fabricSummary(c echo.Context) error {
	sum, err := s.fabric.Summary(c.Request().Context())
	if err != nil {
		return err
	}
	var out fabricSummaryJSON
	out.AdaptivePlacement.Gate = sum.Gate
	out.AdaptivePlacement.Allowlist = sum.Allowlist
	out.AdaptivePlacement.ByClient = make([]clientPlacementJSON, 0, len(sum.ByClient))
	for _, p := range sum.ByClient {
		out.AdaptivePlacement.ByClient = append(out.AdaptivePlacement.ByClient, clientPlacementJSON{
			ClientID: p.ClientID, Sessions: p.Sessions, ByMode: p.ByMode, OnAllowlist: p.OnAllowlist,
		})
	}
	out.Sessions.Total = sum.Sessions.Total
	out.Sessions.ByMode = sum.Sessions.ByMode
	out.Sessions.BySource = sum.Sessions.BySource
	out.Instances = make([]FabricInstance, 0, len(sum.Instances))
	for _, in := range sum.Instances {
		out.Instances = append(out.Instances, FabricInstance{
			InstanceID: in.ID, URL: in.URL, Healthy: in.Healthy, Draining: in.Draining, Process: in.Process,
			Sessions: in.Sessions, AttachedQueues: in.AttachedQueues, LastHeartbeatAt: in.LastHeartbeatAt.UTC(),
			BusKeyVersion: knownVersion(in.BusKeyVersion),
		})
	}
	out.Summary.TotalFallbacks = sum.Counts.Fallbacks
	out.Summary.TotalReassignments = sum.Counts.Reassignments
	out.Summary.TotalAdaptivePlacements = sum.Counts.AdaptivePlacements
	out.Summary.TotalAdaptivePlacementMismatches = sum.Counts.AdaptivePlacementMismatches
	out.FallbackEvents = make([]fallbackEventJSON, 0, len(sum.Fallbacks))
	for _, e := range sum.Fallbacks {
		out.FallbackEvents = append(out.FallbackEvents, fallbackEventJSON{
			SessionID: e.SessionID, FromInstance: e.FromInstance, ToInstance: e.ToInstance,
			RuntimeMode: e.RuntimeMode, RuntimeModeSource: e.RuntimeModeSource, Reason: e.Reason, At: e.At.UTC(),
		})
	}
	return c.JSON(http.StatusOK, out)
}

// knownVersion is v, or nil when v is 0 (unknown).
func knownVersion(v int64) *int64 {
	if v == 0 {
		return nil
	}
	return &v
}
