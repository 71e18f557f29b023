package hub

import (
	"context"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/hub/conns"
	"github.com/marconihub/marconi/sessionstore"
)

// place asks the fabric whether sess may attach here and builds the welcome.
// A connection here that is being closed still counts as the session's queue
// (this attach replaces it); one that sess shows superseded does not.
func (s *Server) place(ctx context.Context, sess sessionstore.Session) (conns.Welcome, error) {
	p, err := s.fabric.Place(ctx, sess, s.conns.Current(sess))
	if err != nil {
		return conns.Welcome{}, err
	}
	return conns.Welcome{
		Type: marconi.FrameWelcome, SessionID: sess.SessionID, InstanceID: s.cfg.InstanceID,
		Resumed: p.Resumed, AffinityReset: p.AffinityReset, Dropped: p.Dropped,
	}, nil
}
