package hub

import (
	"context"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub/conns"
	"github.com/marconihub/marconi/sessionstore"
)

// attach is GET /v1/ws: it checks the handshake, authenticates the session,
// places it here and hands the connection to the connection hub, which
// upgrades it, makes it the session's queue, replays every unacknowledged
// signal in seq order and then writes live ones.
func (s *Server) attach(c echo.Context) error {
	// The handshake and the connection caps are checked before any other
	// work: a request that cannot become a WebSocket changes nothing.
	release, err := s.conns.Admit(c.Request(), c.Response().Header())
	if err != nil {
		return err
	}
	sess, welcome, err := s.prepareAttach(c)
	if err != nil {
		release()
		return err
	}
	s.conns.Attach(c.Response(), c.Request(), sess, welcome, release)
	return nil
}

// prepareAttach authenticates the session of an attach, places it here and
// builds its welcome.
func (s *Server) prepareAttach(c echo.Context) (sessionstore.Session, conns.Welcome, error) {
	if s.Draining() {
		return sessionstore.Session{}, conns.Welcome{}, marconi.Errorf(marconi.CodeDraining, "this instance is draining; attach elsewhere")
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	sess, err := s.authenticateSessionCtx(ctx, bearer(c))
	if err != nil {
		return sess, conns.Welcome{}, err
	}
	if err := s.attachAllowed(sess.Key); err != nil {
		return sess, conns.Welcome{}, err
	}
	welcome, err := s.place(ctx, sess)
	// welcome.Replayed is counted when the attach is recorded (conns).
	return sess, welcome, err
}

// attachAllowed spends one token of k's attach bucket
// (MARCONI_QUOTA_ATTACHES_PER_SECOND, burst twice it): each attach costs
// store writes (placement, the attach, the detach), so churn past the rate
// is refused before any of them.
func (s *Server) attachAllowed(k sessionstore.Key) error {
	ok, wait := s.attaches.Take(k)
	if ok {
		return nil
	}
	return marconi.QuotaExceeded(marconi.QuotaAttachesPerSession, wait,
		"more than %g WebSocket attaches a second for this session", s.cfg.QuotaAttachesPerSecond)
}
