package hub

import (
	"context"
	"errors"

	"github.com/marconihub/marconi/fabric"
)

// SchemaMismatch is why the store's schema is not the one this binary
// needs. Class is for anyone ("schema behind this binary"); Detail, with the
// versions and what to run, is for a request carrying the admin token.
// Refuse says the schema lacks what this binary uses (behind, dirty): every
// store-backed call answers 503 registry_unavailable rather than fail on it.
type SchemaMismatch struct {
	Class, Detail string
	Refuse        bool
}

func (e *SchemaMismatch) Error() string { return e.Detail }

// schemaMismatch is /readyz's message when the last schema check found the
// store's schema not the one this binary needs (behind, ahead or dirty), or "".
func (s *Server) schemaMismatch(admin bool) string {
	sm := s.schemaOff.Load()
	if sm == nil {
		return ""
	}
	cause := sm.Class
	if admin {
		cause = sm.Detail
	}
	return "the session registry is not ready (" + cause + ")"
}

// watchSchema checks the schema at once and then once per instance
// heartbeat, until ctx ends.
func (s *Server) watchSchema(ctx context.Context) {
	every := s.cfg.Fabric.HeartbeatEvery
	if every <= 0 {
		every = fabric.DefaultHeartbeatEvery
	}
	s.checkSchema(ctx)
	s.every(ctx, every, s.checkSchema)
}

// checkSchema runs Deps.Schema once and keeps its verdict for /readyz. It
// runs off the request path, so a slow store never makes /readyz slow or
// unready; a check that fails for another reason keeps the last verdict.
func (s *Server) checkSchema(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	err := s.schema(ctx)
	var sm *SchemaMismatch
	switch {
	case err == nil:
		s.schemaOff.Store(nil)
	case errors.As(err, &sm):
		if s.schemaOff.Swap(sm) == nil {
			s.log.Warn("schema is not this binary's; /readyz fails until it is", "cause", sm.Detail)
		}
	default: // the store is down or slow: /readyz and the breaker say so already
		s.log.Debug("read the schema version", "err", err)
	}
}
