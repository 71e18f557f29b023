package hub

import (
	"context"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// heartbeatTouch records a heartbeat of sess, made with the token hashed
// tokenHash, as proof of life (sessions.Service.Heartbeat: only while that
// registration and token hold the session) and returns sess as it now
// stands. At most
// one heartbeat per session and TouchInterval is written on this instance:
// one that comes sooner is answered from sess as the store has it (its
// expiry as last extended), without a write, and counted as a
// heartbeats_per_session refusal. A heartbeat written raises the expiry
// that the session's WebSocket held here, if any, knows (conns.Hub.SessionExtended).
func (s *Server) heartbeatTouch(ctx context.Context, sess sessionstore.Session, tokenHash []byte, now time.Time) (sessionstore.Session, error) {
	if !s.heartbeatWrites.allow(sess.Key, now) {
		s.QuotaRefused(marconi.QuotaHeartbeatsPerSession)
		return sess, nil
	}
	exp, err := s.sessions.Heartbeat(ctx, sess.Key, sessionstore.Holder{RegisteredAt: sess.RegisteredAt, TokenHash: tokenHash})
	if err != nil {
		return sess, err
	}
	sess.LastSeenAt, sess.LastVerbAt, sess.ExpiresAt = now, now, exp
	s.conns.SessionExtended(sess)
	return sess, nil
}
