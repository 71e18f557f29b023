package hub

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// quotaMetrics counts every quota refusal, by quota.
type quotaMetrics struct {
	refusals *prometheus.CounterVec
}

func newQuotaMetrics(r prometheus.Registerer) (*quotaMetrics, error) {
	m := &quotaMetrics{refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "marconi_quota_refusals_total",
		Help: "Requests and connections refused because a quota was exceeded, by quota (docs/security.md).",
	}, []string{"quota"})}
	for _, q := range marconi.Quotas {
		m.refusals.WithLabelValues(string(q))
	}
	if err := r.Register(m.refusals); err != nil {
		return nil, err
	}
	return m, nil
}

// QuotaRefused counts one refusal of quota q in marconi_quota_refusals_total.
// Refusals answered through the hub's error handler (the connection caps
// included) are counted there; the connection layer calls this for those it
// answers itself (a frame-rate close). An unknown quota is not counted, so the label set stays
// the bounded list marconi.Quotas.
func (s *Server) QuotaRefused(q marconi.Quota) {
	for _, known := range marconi.Quotas {
		if q == known {
			s.quotas.refusals.WithLabelValues(string(q)).Inc()
			return
		}
	}
	s.log.Warn("quota refusal with an unknown quota name", "quota", string(q))
}

// registrationAllowed spends one token of the API key's registration bucket
// (MARCONI_QUOTA_REGISTRATIONS_PER_SECOND, burst twice that). Buckets are
// kept in this instance's memory, keyed by the key's hash, only for keys
// that authenticated and only until they refill: memory is bounded by the
// keys registering right now.
func (s *Server) registrationAllowed(apiKey string) error {
	ok, wait := s.registrations.take(sha256.Sum256([]byte(apiKey)))
	if ok {
		return nil
	}
	return marconi.QuotaExceeded(marconi.QuotaRegistrationsPerSecond, wait,
		"more than %g registrations a second with this API key", s.cfg.QuotaRegistrationsPerSecond)
}

// sessionQuotaRecount is how long a project found at its sessions quota is
// refused from memory before its sessions are counted again: counting a
// full project scans its sessions (about 15 ms at 20000 on Postgres), and
// a key hammering a full project must not turn that into database load.
const sessionQuotaRecount = time.Second

// checkSessionQuota refuses a new session when its project already holds
// MARCONI_QUOTA_SESSIONS_PER_PROJECT live sessions. Waiting does not help
// (sessions end when deregistered or expired), so no Retry-After.
func (s *Server) checkSessionQuota(ctx context.Context, tp TenantProject) error {
	limit := s.cfg.QuotaSessionsPerProject
	now := s.now()
	if s.fullProjects.has(tp, now) {
		return errSessionQuota(limit)
	}
	n, err := s.store.CountSessions(ctx, sessionstore.SessionFilter{TenantID: tp.TenantID, ProjectID: tp.ProjectID, Limit: limit}, now)
	if err != nil {
		return err
	}
	if n >= limit {
		s.fullProjects.add(tp, now.Add(sessionQuotaRecount))
		return errSessionQuota(limit)
	}
	return nil
}

func errSessionQuota(limit int) error {
	return marconi.QuotaExceeded(marconi.QuotaSessionsPerProject, 0,
		"this project holds its limit of %d live sessions; deregister some or let them expire", limit)
}

// projectMemo remembers projects until a time (here: found full, until a
// recount is due). Memory is bounded by the projects at their quota right
// now: sweep forgets the rest. It is safe for concurrent use.
type projectMemo struct {
	mu    sync.Mutex
	until map[TenantProject]time.Time
}

func newProjectMemo() *projectMemo {
	return &projectMemo{until: make(map[TenantProject]time.Time)}
}

func (m *projectMemo) has(tp TenantProject, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return now.Before(m.until[tp])
}

func (m *projectMemo) add(tp TenantProject, until time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.until[tp] = until
}

func (m *projectMemo) forget(tp TenantProject) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.until, tp)
}

func (m *projectMemo) sweep(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for tp, until := range m.until {
		if !now.Before(until) {
			delete(m.until, tp)
		}
	}
}

// keyedMutex serialises work per key (here: new sessions of one project on
// this instance, so that counting and creating cannot race past the quota).
// An entry lives only while some goroutine holds or waits for it, so memory
// is bounded by the requests in flight. It is safe for concurrent use.
type keyedMutex[K comparable] struct {
	mu    sync.Mutex
	locks map[K]*keyedEntry
}

type keyedEntry struct {
	held chan struct{} // one slot: full while held
	refs int
}

func newKeyedMutex[K comparable]() *keyedMutex[K] {
	return &keyedMutex[K]{locks: make(map[K]*keyedEntry)}
}

// lock locks k, or gives up when ctx ends first, and returns its unlock.
func (m *keyedMutex[K]) lock(ctx context.Context, k K) (unlock func(), err error) {
	m.mu.Lock()
	e, ok := m.locks[k]
	if !ok {
		e = &keyedEntry{held: make(chan struct{}, 1)}
		m.locks[k] = e
	}
	e.refs++
	m.mu.Unlock()
	release := func() {
		m.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(m.locks, k)
		}
		m.mu.Unlock()
	}
	select {
	case e.held <- struct{}{}:
		return func() { <-e.held; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
