package hub

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
	"github.com/marconihub/marconi/signals/selfheal"
)

type createKeyRequest struct {
	TenantID  string `json:"tenant_id"`
	ProjectID string `json:"project_id"`
}

// createAPIKey is POST /v1/ops/api_keys. The key is shown once; only its
// hash is stored.
func (s *Server) createAPIKey(c echo.Context) error {
	var req createKeyRequest
	if err := decodeBody(c, 4<<10, &req); err != nil {
		return err
	}
	for name, v := range map[string]string{"tenant_id": req.TenantID, "project_id": req.ProjectID} {
		if !signals.ValidSessionID(v) {
			return marconi.Errorf(marconi.CodeInvalidField, "%s must match %s", name, signals.IDForm)
		}
	}
	key := NewAPIKey()
	err := s.store.PutAPIKey(c.Request().Context(), sessionstore.APIKey{
		Hash: hashSecret(key), TenantID: req.TenantID, ProjectID: req.ProjectID, CreatedAt: s.now(),
	})
	if err != nil {
		return err
	}
	s.log.Info("api key created", "tenant_id", req.TenantID, "project_id", req.ProjectID)
	return c.JSON(http.StatusCreated, map[string]string{"api_key": key, "tenant_id": req.TenantID, "project_id": req.ProjectID})
}

type revokeKeyRequest struct {
	APIKey string `json:"api_key"`
}

// revokeAPIKey is POST /v1/ops/api_keys/revoke: the key, made by
// POST /v1/ops/api_keys, authenticates nothing from then on, on every
// instance (none caches it). The key travels in the body, never in the
// path, where proxies log it. A key of MARCONI_API_KEYS is configuration:
// the answer says to remove it there.
func (s *Server) revokeAPIKey(c echo.Context) error {
	var req revokeKeyRequest
	if err := decodeBody(c, 4<<10, &req); err != nil {
		return err
	}
	if req.APIKey == "" {
		return marconi.Errorf(marconi.CodeInvalidField, "api_key is required: the key to revoke, as POST /v1/ops/api_keys answered it")
	}
	if s.creds.isConfiguredKey(req.APIKey) {
		return marconi.Errorf(marconi.CodeInvalidField, "this key is set in MARCONI_API_KEYS, not in the store: remove it there and restart every instance")
	}
	k, err := s.store.DeleteAPIKey(c.Request().Context(), hashSecret(req.APIKey))
	if errors.Is(err, sessionstore.ErrNotFound) {
		return marconi.Errorf(marconi.CodeNotFound, "no such API key in the store (never made, or already revoked)")
	}
	if err != nil {
		return err
	}
	s.log.Info("api key revoked", "tenant_id", k.TenantID, "project_id", k.ProjectID)
	return c.JSON(http.StatusOK, map[string]any{"revoked": true, "tenant_id": k.TenantID, "project_id": k.ProjectID})
}

type routeQueueJSON struct {
	Attached        bool       `json:"attached"`
	InstanceID      *string    `json:"instance_id"`
	InstanceHealthy bool       `json:"instance_healthy"`
	AttachedAt      *time.Time `json:"attached_at"`
}

type routeStoreJSON struct {
	Surface           marconi.Surface     `json:"surface"`
	RegisteredAt      time.Time           `json:"registered_at"`
	LastSeenAt        *time.Time          `json:"last_seen_at"`
	LastVerbAt        *time.Time          `json:"last_verb_at"`
	ExpiresAt         time.Time           `json:"expires_at"`
	RuntimeMode       marconi.RuntimeMode `json:"runtime_mode"`
	RuntimeModeSource marconi.ModeSource  `json:"runtime_mode_source"`
	AssignedInstance  *string             `json:"assigned_instance"`
	QueueDetachedAt   *time.Time          `json:"queue_detached_at"`
}

type routeSelfhealJSON struct {
	Enabled         bool    `json:"enabled"`
	EligibleSurface bool    `json:"eligible_surface"`
	RecipientTokens float64 `json:"recipient_tokens"`
	SenderTokens    float64 `json:"sender_tokens"`
}

type routeStateJSON struct {
	TenantID              string             `json:"tenant_id"`
	ProjectID             string             `json:"project_id"`
	SessionID             string             `json:"session_id"`
	RouteState            marconi.RouteState `json:"route_state"`
	Queue                 routeQueueJSON     `json:"queue"`
	Store                 *routeStoreJSON    `json:"store"`
	FreshestProofOfLife   *time.Time         `json:"freshest_proof_of_life"`
	FreshestSource        *string            `json:"freshest_proof_of_life_source"`
	ProofOfLifeAgeSeconds *float64           `json:"proof_of_life_age_seconds"`
	FreshnessSeconds      float64            `json:"freshness_seconds"`
	Selfheal              *routeSelfhealJSON `json:"selfheal"`
	PendingSignals        int                `json:"pending_signals"`
	Explanation           string             `json:"explanation"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// routeState builds the operator's view of one session.
func (s *Server) routeState(ctx context.Context, k sessionstore.Key, sess *sessionstore.Session) (routeStateJSON, error) {
	now := s.now()
	fresh := s.signals.Config().Freshness
	out := routeStateJSON{TenantID: k.TenantID, ProjectID: k.ProjectID, SessionID: k.SessionID, FreshnessSeconds: fresh.Seconds()}
	if sess == nil {
		got, err := s.store.GetSession(ctx, k, now)
		if errors.Is(err, sessionstore.ErrNotFound) {
			out.RouteState = marconi.StateNotRegistered
			out.Explanation = explain(out.RouteState, 0, fresh)
			return out, nil
		}
		if err != nil {
			return out, err
		}
		sess = &got
	}
	r := s.conns.Route(ctx, *sess)
	out.RouteState = signals.Classify(*sess, r, now, fresh)
	out.Queue = routeQueueJSON{Attached: r.Attached, InstanceHealthy: r.InstanceHealthy, AttachedAt: timePtr(r.AttachedAt)}
	if r.InstanceID != "" {
		out.Queue.InstanceID = &r.InstanceID
	}
	st := &routeStoreJSON{
		Surface: sess.Surface, RegisteredAt: sess.RegisteredAt.UTC(), LastSeenAt: timePtr(sess.LastSeenAt),
		LastVerbAt: timePtr(sess.LastVerbAt), ExpiresAt: sess.ExpiresAt.UTC(), RuntimeMode: sess.RuntimeMode,
		RuntimeModeSource: sess.RuntimeModeSource, QueueDetachedAt: timePtr(sess.QueueDetachedAt),
	}
	if sess.AssignedInstance != "" {
		st.AssignedInstance = &sess.AssignedInstance
	}
	out.Store = st
	pol := sess.FreshestProofOfLife()
	out.FreshestProofOfLife = timePtr(pol)
	src := freshestSource(*sess)
	out.FreshestSource = &src
	age := now.Sub(pol).Seconds()
	out.ProofOfLifeAgeSeconds = &age
	out.Selfheal = &routeSelfhealJSON{
		Enabled:         s.selfheal.Config().Enabled,
		EligibleSurface: sess.Surface.Live(),
		RecipientTokens: s.selfheal.Tokens(selfheal.SideRecipient, k.TenantID, k.ProjectID, k.SessionID),
		SenderTokens:    s.selfheal.Tokens(selfheal.SideSender, k.TenantID, k.ProjectID, k.SessionID),
	}
	n, err := s.store.CountPending(ctx, k)
	if err != nil {
		return out, err
	}
	out.PendingSignals = n
	out.Explanation = explain(out.RouteState, now.Sub(pol), fresh)
	if out.RouteState == marconi.StateRouteWithoutQueue {
		switch {
		case !out.Selfheal.EligibleSurface:
			out.Explanation = "The agent proved it was alive " + now.Sub(pol).Round(time.Second).String() + " ago and holds no WebSocket: its surface (" +
				string(sess.Surface) + ") is piggyback-only, so this is its normal state. It collects signals by heartbeat, drain or the pending of its own sends."
		case !out.Selfheal.Enabled:
			out.Explanation = "The agent proved it was alive " + now.Sub(pol).Round(time.Second).String() + " ago but holds no WebSocket on a healthy instance. " +
				"Self-heal is off (MARCONI_SELFHEAL), so its sends carry no sender_route_stale: it heals when its client redials by itself. Signals are stored and wait. " +
				processStopped
		}
	}
	switch {
	case out.RouteState == marconi.StateAttached || r.InstanceID == "":
	case !r.InstanceHealthy:
		out.Explanation += " Its last queue was on instance " + r.InstanceID + ", which is unhealthy."
	case !r.Attached:
		out.Explanation += " Its last queue was on instance " + r.InstanceID + ", which has restarted since: the queue died with the earlier process."
	}
	return out, nil
}

func freshestSource(s sessionstore.Session) string {
	switch pol := s.FreshestProofOfLife(); {
	case pol.Equal(s.LastSeenAt):
		return "last_seen_at"
	case pol.Equal(s.LastVerbAt):
		return "last_verb_at"
	default:
		return "registered_at"
	}
}

// processStopped ends the explanation of a live surface's route_without_queue:
// the hub cannot tell an agent whose WebSocket merely dropped from one whose
// process was killed, and an operator watching a crashed agent must not wait
// for a send that will never come.
const processStopped = "If its process stopped (a crash, kill -9), nothing comes until the agent starts again: " +
	"a client that kept its token resumes the session and receives what waits."

// explain says in one sentence what a route state means and what heals it.
func explain(state marconi.RouteState, age, fresh time.Duration) string {
	a := age.Round(time.Second).String()
	switch state {
	case marconi.StateAttached:
		return "A WebSocket queue is attached on a healthy instance: sends are pushed at once."
	case marconi.StateRouteWithoutQueue:
		return "The agent proved it was alive " + a + " ago but holds no WebSocket on a healthy instance. " +
			"Signals are stored and wait. Its own next send carries sender_route_stale and its client reconnects; a heartbeat or drain also collects them. " +
			processStopped
	case marconi.StateStale:
		return "No WebSocket, and no proof of life for " + a + " (more than the " + fresh.String() + " freshness window): " +
			"the agent looks genuinely offline. Signals are stored until it attaches or drains, or the session expires."
	default:
		return "No live session with this id in this tenant and project: it never registered, expired or was deleted."
	}
}

// routeStateOne is GET /v1/ops/route_state/{tenant}/{project}/{session}.
func (s *Server) routeStateOne(c echo.Context) error {
	k := sessionstore.Key{TenantID: c.Param("tenant"), ProjectID: c.Param("project"), SessionID: c.Param("session")}
	for _, v := range []string{k.TenantID, k.ProjectID, k.SessionID} {
		if !signals.ValidSessionID(v) {
			return marconi.Errorf(marconi.CodeNotFound, "malformed route_state path")
		}
	}
	rs, err := s.routeState(c.Request().Context(), k, nil)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rs)
}

// maxRouteStateList caps one route_state listing.
const maxRouteStateList = 1000

// routeStateList is GET /v1/ops/route_state?tenant_id=&project_id=&state=&limit=.
func (s *Server) routeStateList(c echo.Context) error {
	f := sessionstore.SessionFilter{TenantID: c.QueryParam("tenant_id"), ProjectID: c.QueryParam("project_id")}
	for name, v := range map[string]string{"tenant_id": f.TenantID, "project_id": f.ProjectID} {
		if v != "" && !signals.ValidSessionID(v) {
			return marconi.Errorf(marconi.CodeInvalidField, "%s must match %s", name, signals.IDForm)
		}
	}
	state := marconi.RouteState(c.QueryParam("state"))
	switch state {
	case "", marconi.StateAttached, marconi.StateRouteWithoutQueue, marconi.StateStale:
	default:
		return marconi.Errorf(marconi.CodeInvalidField, "state must be attached, route_without_queue or stale")
	}
	limit := 100
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxRouteStateList {
			return marconi.Errorf(marconi.CodeInvalidField, "limit must be between 1 and %d", maxRouteStateList)
		}
		limit = n
	}
	if state == "" {
		f.Limit = limit
	}
	ctx := c.Request().Context()
	sessions, err := s.store.ListSessions(ctx, f, s.now())
	if err != nil {
		return err
	}
	out := make([]routeStateJSON, 0, min(len(sessions), limit))
	now, fresh := s.now(), s.signals.Config().Freshness
	for i := range sessions {
		if len(out) == limit {
			break
		}
		// Filter on the route state first: it costs no store call, the full
		// view (pending count) does.
		if state != "" && signals.Classify(sessions[i], s.conns.Route(ctx, sessions[i]), now, fresh) != state {
			continue
		}
		rs, err := s.routeState(ctx, sessions[i].Key, &sessions[i])
		if err != nil {
			return err
		}
		out = append(out, rs)
	}
	return c.JSON(http.StatusOK, map[string]any{"sessions": out})
}
