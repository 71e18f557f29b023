package hub

import (
	"context"
	"crypto/sha256"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/sessions"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
)

// registerBodyLimit bounds a registration body.
const registerBodyLimit = 16 << 10

type registerRequest struct {
	SessionID   string              `json:"session_id"`
	Surface     marconi.Surface     `json:"surface"`
	RuntimeMode marconi.RuntimeMode `json:"runtime_mode"`
	ClientID    string              `json:"client_id"`
	Takeover    bool                `json:"takeover"`
	Hints       struct {
		LocalState  bool `json:"local_state"`
		SideEffects bool `json:"side_effects"`
	} `json:"hints"`
}

// Registration headers: the registration's optional idempotency key (a
// retry of a registration whose answer was lost presents the same key and
// is answered with a new token instead of 403), and the current token of
// the session to resume (docs/api.md).
const (
	headerIdempotencyKey = "Idempotency-Key"
	headerSessionToken   = "X-Marconi-Session-Token"
)

// register is POST /v1/sessions: decode, the sessions service, encode.
func (s *Server) register(c echo.Context) error {
	if s.Draining() {
		return marconi.Errorf(marconi.CodeDraining, "this instance is draining; register elsewhere")
	}
	owner, err := s.apiKeyOwner(c)
	if err != nil {
		return err
	}
	apiKeyHash := sha256.Sum256([]byte(bearer(c)))
	if err := s.sessions.SpendRegistration(apiKeyHash); err != nil {
		return err
	}
	var req registerRequest
	if err := decodeBody(c, registerBodyLimit, &req); err != nil {
		return err
	}
	h := c.Request().Header
	reg, err := s.sessions.Register(c.Request().Context(), sessions.RegisterRequest{
		Project:     sessions.Project{TenantID: owner.TenantID, ProjectID: owner.ProjectID},
		APIKeyHash:  apiKeyHash[:],
		SessionID:   req.SessionID,
		Surface:     req.Surface,
		RuntimeMode: req.RuntimeMode,
		ClientID:    req.ClientID,
		Hints:       sessions.Hints{LocalState: req.Hints.LocalState, SideEffects: req.Hints.SideEffects},
		Token:       h.Get(headerSessionToken),

		IdempotencyKey: h.Get(headerIdempotencyKey),
		Takeover:       req.Takeover,
	})
	if err != nil {
		return err
	}
	status := http.StatusOK
	if reg.Created() {
		status = http.StatusCreated
	}
	return c.JSON(status, s.sessionAnswer(c.Request().Context(), reg))
}

// sessionAnswer is the answer to a registration or a resume.
func (s *Server) sessionAnswer(ctx context.Context, reg sessions.Registration) marconi.SessionAnswer {
	sess := reg.Session
	r := marconi.SessionAnswer{
		SessionID: sess.SessionID, Token: reg.Token, TenantID: sess.TenantID, ProjectID: sess.ProjectID,
		Surface: sess.Surface, RuntimeMode: sess.RuntimeMode, RuntimeModeSource: sess.RuntimeModeSource,
		InstanceID:   s.cfg.InstanceID,
		RegisteredAt: sess.RegisteredAt.UTC(), ExpiresAt: sess.ExpiresAt.UTC(),
		HeartbeatIntervalSeconds: int(s.cfg.HeartbeatInterval / time.Second),
		TakenOver:                reg.Outcome == sessions.OutcomeTakenOver,
	}
	if sess.RuntimeMode == fabric.ModeSticky && sess.AssignedInstance != "" {
		r.InstanceID = sess.AssignedInstance
		if u := s.fabric.Members.URL(ctx, sess.AssignedInstance); u != "" {
			r.InstanceURL = &u // null when the instance table does not know it
		}
	}
	return r
}

type heartbeatResponse struct {
	SessionID  string       `json:"session_id"`
	RouteState string       `json:"route_state"`
	ExpiresAt  time.Time    `json:"expires_at"`
	Pending    []signalJSON `json:"pending"`
	// History is the token of the store's history pending was read under,
	// when it was read and the store keeps one.
	History string `json:"history,omitempty"`
}

// heartbeat is POST /v1/heartbeat: proof of life, expiry extended, and the
// caller's pending signals when it has no attached queue.
func (s *Server) heartbeat(c echo.Context) error {
	sess := session(c)
	ctx := c.Request().Context()
	now := s.now()
	sess, err := s.heartbeatTouch(ctx, sess, tokenHash(c), now)
	if err != nil {
		return err
	}
	exp := sess.ExpiresAt
	route := s.conns.Route(ctx, sess)
	resp := heartbeatResponse{
		SessionID:  sess.SessionID,
		RouteState: string(signals.Classify(sess, route, now, s.signals.Config().Freshness)),
		ExpiresAt:  exp.UTC(),
		Pending:    []signalJSON{},
	}
	if !route.Attached {
		resp.History = s.signals.History() // before the read: the history it was made under, or an earlier one
		p, err := s.signals.Pending(ctx, sess.Key, 0, s.signals.Config().PiggybackLimit)
		if err != nil {
			return err
		}
		resp.Pending = toSignalsJSON(p)
	}
	return c.JSON(http.StatusOK, resp)
}

// deregister is DELETE /v1/session.
func (s *Server) deregister(c echo.Context) error {
	if err := s.sessions.Deregister(c.Request().Context(), session(c)); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}

// touchVerb records an authenticated call as proof of life, at most once per
// TouchInterval per session (the loaded session says when it was last written).
// A touch written raises the expiry that the token cache and the session's
// WebSocket held here, if any, know (conns.Hub.SessionExtended), as a
// heartbeat's does. The touch applies only while the registration and token
// the call authenticated still hold the session: one registered again or
// resumed meanwhile is not the caller's to extend.
func (s *Server) touchVerb(c echo.Context, sess sessionstore.Session) {
	now := s.now()
	if now.Sub(sess.LastVerbAt) < s.cfg.TouchInterval {
		return
	}
	t := sessionstore.Touch{VerbAt: now, ExpiresAt: now.Add(s.cfg.SessionTTL)}
	h := sessionstore.Holder{RegisteredAt: sess.RegisteredAt, TokenHash: tokenHash(c)}
	err := s.store.TouchSessionAs(c.Request().Context(), sess.Key, h, t, now)
	if err != nil {
		s.log.Debug("touch verb", keyAttrs(sess.Key), "err", err)
		return
	}
	s.tokens.touched([32]byte(tokenHash(c)), t)
	sess.ExpiresAt = t.ExpiresAt // a lower bound of the row's: TouchSession never moves it earlier
	s.conns.SessionExtended(sess)
}

// revoker is how the sessions service makes a token that stopped working
// stop everywhere on this instance: the token cache forgets it and the
// connection hub closes what it opened.
type revoker struct{ s *Server }

func (r revoker) Replaced(ctx context.Context, sess sessionstore.Session, oldHash []byte) {
	r.s.tokens.drop(oldHash)
	r.s.conns.TokenReplaced(ctx, sess)
}

func (r revoker) Ended(ctx context.Context, sess sessionstore.Session) {
	r.s.tokens.drop(sess.TokenHash)
	r.s.conns.SessionEnded(ctx, sess)
}
