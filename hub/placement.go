package hub

import (
	"context"

	"github.com/google/uuid"

	"github.com/marconihub/marconi/sessionstore"
)

func newSessionID() string { return uuid.NewString() }

// place asks the fabric whether sess may attach here and builds the welcome.
func (s *Server) place(ctx context.Context, sess sessionstore.Session) (welcomeFrame, error) {
	p, err := s.fabric.Place(ctx, sess, s.registry.get(sess.Key) != nil)
	if err != nil {
		return welcomeFrame{}, err
	}
	return welcomeFrame{
		Type: "welcome", SessionID: sess.SessionID, InstanceID: s.cfg.InstanceID,
		Resumed: p.Resumed, AffinityReset: p.AffinityReset, Dropped: p.Dropped,
	}, nil
}
