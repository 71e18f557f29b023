package hub

import (
	"context"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
)

// attach is GET /v1/ws: it checks the handshake, authenticates the session, places it here and
// hands the connection to the connection hub, which upgrades it, makes it
// the session's queue, replays every unacknowledged signal in seq order and
// then writes live ones.
func (s *Server) attach(c echo.Context) error {
	// The handshake and the connection caps are checked before any other
	// work: a request that cannot become a WebSocket changes nothing.
	release, err := s.conns.Admit(c.Request(), c.Response().Header())
	if err != nil {
		return err
	}
	defer release()
	if s.Draining() {
		return marconi.Errorf(marconi.CodeDraining, "this instance is draining; attach elsewhere")
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	sess, err := s.authenticateSessionCtx(ctx, bearer(c))
	if err != nil {
		cancel()
		return err
	}
	welcome, err := s.place(ctx, sess)
	if err != nil {
		cancel()
		return err
	}
	pending, err := s.store.CountPending(ctx, sess.Key)
	cancel()
	if err != nil {
		return err
	}
	welcome.Replayed = pending
	s.conns.Attach(c.Response(), c.Request(), sess, welcome)
	return nil
}
