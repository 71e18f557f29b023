package conns

import (
	"sync"

	"github.com/marconihub/marconi/sessionstore"
)

// registry is the in-memory map of session to live queue on this instance.
// It is safe for concurrent use.
type registry struct {
	mu    sync.Mutex
	conns map[sessionstore.Key]*Conn
}

func newRegistry() *registry {
	return &registry{conns: make(map[sessionstore.Key]*Conn)}
}

// attach makes c the session's queue and returns the one it replaced.
func (r *registry) attach(c *Conn) *Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.conns[c.key]
	r.conns[c.key] = c
	return old
}

// detach removes c if it is still the session's queue, and reports whether it was.
func (r *registry) detach(c *Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns[c.key] != c {
		return false
	}
	delete(r.conns, c.key)
	return true
}

func (r *registry) get(k sessionstore.Key) *Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns[k]
}

func (r *registry) all() []*Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Conn, 0, len(r.conns))
	for _, c := range r.conns {
		out = append(out, c)
	}
	return out
}

// each calls f for every connection, under the registry's lock: f must be
// quick and must not call the registry.
func (r *registry) each(f func(*Conn)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		f(c)
	}
}
