package hub

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub/conns"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
	"github.com/marconihub/marconi/signals/selfheal"
)

// The dashboard's actions and views on one session, and the self-heal
// history (docs/api.md, "Operator actions").

// opsKey reads and checks the :tenant/:project/:session path of an ops route.
func opsKey(c echo.Context) (sessionstore.Key, error) {
	k := sessionstore.Key{TenantID: c.Param("tenant"), ProjectID: c.Param("project"), SessionID: c.Param("session")}
	for _, v := range []string{k.TenantID, k.ProjectID, k.SessionID} {
		if !signals.ValidSessionID(v) {
			return k, marconi.Errorf(marconi.CodeNotFound, "malformed session path")
		}
	}
	return k, nil
}

// opsMaxPending caps one listing of a session's pending signals.
const opsMaxPending = 200

// opsPending is GET /v1/ops/sessions/{tenant}/{project}/{session}/signals?limit=:
// the session's pending signals, oldest first, and how many there are.
func (s *Server) opsPending(c echo.Context) error {
	k, err := opsKey(c)
	if err != nil {
		return err
	}
	limit := 50
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > opsMaxPending {
			return marconi.Errorf(marconi.CodeInvalidField, "limit must be between 1 and %d", opsMaxPending)
		}
		limit = n
	}
	ctx := c.Request().Context()
	sess, err := s.store.GetSession(ctx, k, s.now())
	if errors.Is(err, sessionstore.ErrNotFound) {
		return marconi.Errorf(marconi.CodeNotFound, "no live session %s/%s/%s", k.TenantID, k.ProjectID, k.SessionID)
	}
	if err != nil {
		return err
	}
	total, err := s.store.CountPending(ctx, sess.Key)
	if err != nil {
		return err
	}
	sigs, err := s.store.PendingSignals(ctx, sess.Key, 0, limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"session_id": k.SessionID, "total": total, "signals": toSignalsJSON(sigs)})
}

// opsDisconnect is POST /v1/ops/sessions/{tenant}/{project}/{session}/disconnect:
// close the session's WebSocket with 1012 so that its client reconnects.
// Only the instance holding the connection can close it: another instance
// answers 409 wrong_instance naming it.
func (s *Server) opsDisconnect(c echo.Context) error {
	k, err := opsKey(c)
	if err != nil {
		return err
	}
	sess, err := s.store.GetSession(c.Request().Context(), k, s.now())
	if errors.Is(err, sessionstore.ErrNotFound) {
		return marconi.Errorf(marconi.CodeNotFound, "no live session %s/%s/%s", k.TenantID, k.ProjectID, k.SessionID)
	}
	if err != nil {
		return err
	}
	if s.conns.Current(sess) {
		s.conns.Kick(k, conns.DisconnectOperator)
		s.log.Info("session disconnected by an operator", keyAttrs(k))
		return c.JSON(http.StatusOK, map[string]any{"disconnected": true, "instance_id": s.cfg.InstanceID})
	}
	if sess.QueueInstance != "" && sess.QueueInstance != s.cfg.InstanceID && s.fabric.Members.Healthy(c.Request().Context(), sess.QueueInstance) {
		return &marconi.Error{Code: marconi.CodeWrongInstance, InstanceID: sess.QueueInstance, InstanceURL: s.fabric.Members.URL(c.Request().Context(), sess.QueueInstance),
			Message: "the WebSocket of this session is held by instance " + sess.QueueInstance + "; disconnect it there"}
	}
	return c.JSON(http.StatusOK, map[string]any{"disconnected": false, "instance_id": s.cfg.InstanceID})
}

// opsDeregister is DELETE /v1/ops/sessions/{tenant}/{project}/{session}:
// what DELETE /v1/session does, for an operator. 204, or 404 when no live
// session has that key.
func (s *Server) opsDeregister(c echo.Context) error {
	k, err := opsKey(c)
	if err != nil {
		return err
	}
	if err := s.sessions.End(c.Request().Context(), k); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// Self-heal history: the instance's own self-heal outcomes per bucket over
// the last window, kept by the hub so the dashboard shows them at once
// rather than only for the time its tab has been open.
const (
	historyBuckets = 20 // 10 minutes of 30 s buckets
)

type historyBucket struct {
	Start  time.Time          `json:"start"`
	Counts map[string]float64 `json:"counts"`
}

// selfhealHistory is a bounded ring of per-bucket increments of
// marconi_route_self_healed_total, sampled from the registry. It is safe for
// concurrent use.
type selfhealHistory struct {
	gatherer prometheus.Gatherer
	every    time.Duration

	mu      sync.Mutex
	last    map[string]float64
	buckets []historyBucket // oldest first, at most historyBuckets
}

// outcomeTotals reads the self-heal counters from the registry.
func (h *selfhealHistory) outcomeTotals() (map[string]float64, error) {
	mfs, err := h.gatherer.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != selfheal.MetricName {
			continue
		}
		for _, m := range mf.GetMetric() {
			out[outcomeLabel(m)] = m.GetCounter().GetValue()
		}
	}
	return out, nil
}

func outcomeLabel(m *dto.Metric) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == "outcome" {
			return lp.GetValue()
		}
	}
	return ""
}

// sample closes the bucket that started at start with the increments since
// the previous sample. A failed gather leaves a gap, not a wrong bucket.
func (h *selfhealHistory) sample(start time.Time) error {
	cur, err := h.outcomeTotals()
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d := make(map[string]float64, len(cur))
	for o, v := range cur {
		d[o] = v - h.last[o]
	}
	h.last = cur
	h.buckets = append(h.buckets, historyBucket{Start: start.UTC(), Counts: d})
	if len(h.buckets) > historyBuckets {
		h.buckets = append(h.buckets[:0], h.buckets[len(h.buckets)-historyBuckets:]...)
	}
	return nil
}

// opsSelfhealHistory is GET /v1/ops/selfheal/history.
func (s *Server) opsSelfhealHistory(c echo.Context) error {
	h := s.history
	if h == nil {
		return marconi.Errorf(marconi.CodeNotFound, "this hub keeps no self-heal history (no metrics registry)")
	}
	totals, err := h.outcomeTotals()
	if err != nil {
		return err
	}
	h.mu.Lock()
	buckets := append([]historyBucket{}, h.buckets...)
	h.mu.Unlock()
	return c.JSON(http.StatusOK, map[string]any{
		"instance_id":    s.cfg.InstanceID,
		"enabled":        s.selfheal.Config().Enabled,
		"bucket_seconds": h.every.Seconds(),
		"totals":         totals,
		"buckets":        buckets,
	})
}
