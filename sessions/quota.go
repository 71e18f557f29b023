package sessions

import (
	"context"
	"sync"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Project names the owner of an API key, and so of the sessions it
// registers: a tenant's project.
type Project struct {
	TenantID, ProjectID string
}

// SpendRegistration spends one token of the registration bucket of the API
// key hashed apiKeyHash (MARCONI_QUOTA_REGISTRATIONS_PER_SECOND, burst twice
// that), or refuses with quota_exceeded and how long to wait. Buckets are
// kept in this instance's memory, keyed by the key's hash, only for keys
// that authenticated and only until they refill: memory is bounded by the
// keys registering right now.
func (s *Service) SpendRegistration(apiKeyHash [32]byte) error {
	ok, wait := s.registrations.Take(apiKeyHash)
	if ok {
		return nil
	}
	return marconi.QuotaExceeded(marconi.QuotaRegistrationsPerSecond, wait,
		"more than %g registrations a second with this API key", s.cfg.QuotaRegistrationsPerSecond)
}

// sessionQuotaRecount is how long what a count of a project's sessions
// found is used from memory before they are counted again. Counting scans
// the project's sessions (about 7 ms at 10000 and 15 ms at 20000 on
// Postgres) under the project's lock, so counting at every registration
// held a fleet starting at once to 70-140 registrations a second; and a key
// hammering a full project must not turn into database load.
const sessionQuotaRecount = time.Second

// checkSessionQuota refuses a new session when its project already holds
// MARCONI_QUOTA_SESSIONS_PER_PROJECT live sessions. Waiting does not help
// (sessions end when deregistered or expired), so no Retry-After. Within
// sessionQuotaRecount of a count it decides from memory: a project found
// full is refused; one found with room takes new sessions until a tenth of
// the quota, or the room the count found, is spent (docs/security.md).
func (s *Service) checkSessionQuota(ctx context.Context, tp Project) error {
	limit := s.cfg.QuotaSessionsPerProject
	now := s.now()
	switch s.rooms.spend(tp, now) {
	case roomFull:
		return errSessionQuota(limit)
	case roomSpent:
		return nil
	}
	n, err := s.store.CountSessions(ctx, sessionstore.SessionFilter{TenantID: tp.TenantID, ProjectID: tp.ProjectID, Limit: limit}, now)
	if err != nil {
		return err
	}
	until := now.Add(sessionQuotaRecount)
	if n >= limit {
		s.rooms.set(tp, true, 0, until)
		return errSessionQuota(limit)
	}
	// This registration takes one place; the rest of the room, up to a
	// tenth of the quota, is taken from memory until the next count.
	s.rooms.set(tp, false, min(limit-n, max(limit/10, 1))-1, until)
	return nil
}

func errSessionQuota(limit int) error {
	return marconi.QuotaExceeded(marconi.QuotaSessionsPerProject, 0,
		"this project holds its limit of %d live sessions; deregister some or let them expire", limit)
}

// projectRooms remembers, per project, how many more new sessions it may
// take before its sessions must be counted again, until a recount is due
// anyway. Memory is bounded by the projects counted in the last
// sessionQuotaRecount: sweep forgets the rest. It is safe for concurrent use.
type projectRooms struct {
	mu    sync.Mutex
	rooms map[Project]projectRoom
}

type projectRoom struct {
	left  int  // new sessions it may take from memory before a count
	full  bool // a count found it full
	until time.Time
}

// A project's new session, decided from memory.
type roomDecision int

const (
	roomCount roomDecision = iota // nothing remembered, or used up: count
	roomFull                      // a count found the project full: refuse
	roomSpent                     // one place of the remembered room taken: allow
)

func newProjectRooms() *projectRooms {
	return &projectRooms{rooms: make(map[Project]projectRoom)}
}

// spend decides tp's new session from memory, taking one place when it can.
func (m *projectRooms) spend(tp Project, now time.Time) roomDecision {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rooms[tp]
	switch {
	case !ok || !now.Before(r.until):
		return roomCount
	case r.full:
		return roomFull
	case r.left == 0:
		return roomCount
	}
	r.left--
	m.rooms[tp] = r
	return roomSpent
}

// set remembers, until then, what a count found: tp full, or with room
// for left more new sessions from memory.
func (m *projectRooms) set(tp Project, full bool, left int, until time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rooms[tp] = projectRoom{left: left, full: full, until: until}
}

// forget drops what is remembered of tp, so that its next new session is
// counted (a deregistration freed a place).
func (m *projectRooms) forget(tp Project) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.rooms, tp)
}

func (m *projectRooms) sweep(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for tp, r := range m.rooms {
		if !now.Before(r.until) {
			delete(m.rooms, tp)
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
