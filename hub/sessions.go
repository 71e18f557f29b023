package hub

import (
	"errors"
	"net/http"
	"regexp"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/hub/conns"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
	"github.com/marconihub/marconi/signals/selfheal"
)

// registerBodyLimit bounds a registration body.
const registerBodyLimit = 16 << 10

type registerRequest struct {
	SessionID   string `json:"session_id"`
	Surface     string `json:"surface"`
	RuntimeMode string `json:"runtime_mode"`
	ClientID    string `json:"client_id"`
	Hints       struct {
		LocalState  bool `json:"local_state"`
		SideEffects bool `json:"side_effects"`
	} `json:"hints"`
}

type sessionResponse struct {
	SessionID                string    `json:"session_id"`
	Token                    string    `json:"token"`
	TenantID                 string    `json:"tenant_id"`
	ProjectID                string    `json:"project_id"`
	Surface                  string    `json:"surface"`
	RuntimeMode              string    `json:"runtime_mode"`
	RuntimeModeSource        string    `json:"runtime_mode_source"`
	InstanceID               string    `json:"instance_id"`
	InstanceURL              *string   `json:"instance_url"`
	RegisteredAt             time.Time `json:"registered_at"`
	ExpiresAt                time.Time `json:"expires_at"`
	HeartbeatIntervalSeconds int       `json:"heartbeat_interval_seconds"`
}

var clientIDRe = regexp.MustCompile(`^[\x21-\x7e]{1,128}$`)

// headerIdempotencyKey names the registration's optional idempotency key: a
// retry of a registration whose answer was lost presents the same key and is
// answered with a new token instead of 403 (docs/api.md).
const headerIdempotencyKey = "Idempotency-Key"

// register is POST /v1/sessions: create, or resume with the current token.
func (s *Server) register(c echo.Context) error {
	if s.Draining() {
		return marconi.Errorf(marconi.CodeDraining, "this instance is draining; register elsewhere")
	}
	owner, err := s.apiKeyOwner(c)
	if err != nil {
		return err
	}
	if err := s.registrationAllowed(bearer(c)); err != nil {
		return err
	}
	var req registerRequest
	if err := decodeBody(c, registerBodyLimit, &req); err != nil {
		return err
	}
	if req.SessionID != "" && !signals.ValidSessionID(req.SessionID) {
		return marconi.Errorf(marconi.CodeInvalidField, "session_id must match [A-Za-z0-9._-]{1,128}")
	}
	if !selfheal.Surface(req.Surface).Valid() {
		return marconi.Errorf(marconi.CodeInvalidSurface, "surface %q is not one of %s", req.Surface, selfheal.SurfaceNames)
	}
	if req.ClientID != "" && !clientIDRe.MatchString(req.ClientID) {
		return marconi.Errorf(marconi.CodeInvalidField, "client_id must be 1 to 128 printable ASCII characters")
	}
	if req.RuntimeMode != "" {
		if _, err := fabric.NormalizeRuntimeMode(req.RuntimeMode); err != nil {
			if errors.Is(err, fabric.ErrReservedMode) {
				return marconi.Errorf(marconi.CodeReservedRuntimeMode, "runtime_mode %q is reserved and not implemented; use stateless or sticky", req.RuntimeMode)
			}
			return marconi.Errorf(marconi.CodeInvalidRuntimeMode, "runtime_mode %q is unknown; use stateless or sticky", req.RuntimeMode)
		}
	}
	regKey := c.Request().Header.Get(headerIdempotencyKey)
	if !signals.ValidText(regKey, signals.MaxIdempotencyKeyBytes) {
		return marconi.Errorf(marconi.CodeInvalidField, "%s must be UTF-8 text of at most %d bytes without control characters",
			headerIdempotencyKey, signals.MaxIdempotencyKeyBytes)
	}
	var regKeyHash []byte
	if regKey != "" {
		regKeyHash = hashSecret(regKey)
	}
	ctx := c.Request().Context()
	now := s.now()
	token := NewSecret(prefixSessionToken)
	gone := false // the resume found no live session: nothing to retry

	if old := c.Request().Header.Get("X-Marconi-Session-Token"); old != "" && req.SessionID != "" {
		k := sessionstore.Key{TenantID: owner.TenantID, ProjectID: owner.ProjectID, SessionID: req.SessionID}
		sess, err := s.store.ResumeSession(ctx, k, hashSecret(old), hashSecret(token),
			sessionstore.Touch{VerbAt: now, ExpiresAt: now.Add(s.cfg.SessionTTL)}, now)
		switch {
		case err == nil:
			s.tokens.drop(hashSecret(old))
			s.metrics.registrations.WithLabelValues("resumed").Inc()
			s.log.Info("session resumed", keyAttrs(sess.Key), "surface", sess.Surface, "runtime_mode", sess.RuntimeMode)
			return c.JSON(http.StatusOK, s.sessionResponse(sess, token))
		case errors.Is(err, sessionstore.ErrTokenMismatch):
			if done, err := s.retryRegistration(c, k, regKeyHash, token, now); done {
				return err
			}
			return marconi.Errorf(marconi.CodeForbidden, "session %q is live and this is not its current token", req.SessionID)
		case !errors.Is(err, sessionstore.ErrNotFound):
			return err
		}
		// Expired or deleted: the id is free again; register anew.
		gone = true
	}
	if req.SessionID != "" && !gone {
		// Before the quota: the session of a lost answer is already counted.
		k := sessionstore.Key{TenantID: owner.TenantID, ProjectID: owner.ProjectID, SessionID: req.SessionID}
		if done, err := s.retryRegistration(c, k, regKeyHash, token, now); done {
			return err
		}
	}

	id := req.SessionID
	if id == "" {
		id = newSessionID()
	}
	mode, source := s.placer.RuntimeMode(fabric.Mode(req.RuntimeMode), req.ClientID, fabric.Hints{Surface: req.Surface, LocalState: req.Hints.LocalState, SideEffects: req.Hints.SideEffects})
	sess := sessionstore.Session{
		Key:               sessionstore.Key{TenantID: owner.TenantID, ProjectID: owner.ProjectID, SessionID: id},
		Surface:           req.Surface,
		RuntimeMode:       string(mode),
		RuntimeModeSource: string(source),
		ClientID:          req.ClientID,
		TokenHash:         hashSecret(token),
		// The key's hash, never the key: it is a secret that can mint a token.
		RegistrationKeyHash: regKeyHash,
		RegisteredAt:        now,
		ExpiresAt:           now.Add(s.cfg.SessionTTL),
	}
	// Count and create under the project's lock, so that this instance's
	// concurrent registrations cannot pass the quota together.
	unlock, err := s.newSessions.lock(ctx, owner)
	if err != nil {
		return err
	}
	defer unlock()
	if err := s.checkSessionQuota(ctx, owner); err != nil {
		return err
	}
	if mode == fabric.ModeSticky {
		inst, err := s.placer.Assign(ctx)
		if err != nil {
			return err
		}
		sess.AssignedInstance = inst
	}
	sess, err = s.store.CreateSession(ctx, sess, now)
	if errors.Is(err, sessionstore.ErrConflict) {
		return marconi.Errorf(marconi.CodeForbidden, "session %q is live; present its current token in X-Marconi-Session-Token to resume it", id)
	}
	if err != nil {
		return err
	}
	if source == fabric.SourceAdaptive {
		s.placer.CountAdaptivePlacement(ctx)
	}
	s.metrics.registrations.WithLabelValues("created").Inc()
	s.log.Info("session registered", keyAttrs(sess.Key), "surface", sess.Surface, "runtime_mode", sess.RuntimeMode,
		"runtime_mode_source", sess.RuntimeModeSource, "assigned_instance", sess.AssignedInstance)
	return c.JSON(http.StatusCreated, s.sessionResponse(sess, token))
}

// retryRegistration answers a registration of the live session k that
// carries the Idempotency-Key of the registration that made its current
// token, within the idempotency window: the retry of a registration whose
// answer was lost. The lost token was never seen and is stored only hashed,
// so it cannot be sent again: the session gets token instead, the lost one
// stops working, and the answer is the registration's (201). done is false,
// and nothing changed, when this is not such a retry (no key, another key,
// too old, no live session).
func (s *Server) retryRegistration(c echo.Context, k sessionstore.Key, keyHash []byte, token string, now time.Time) (done bool, err error) {
	if keyHash == nil {
		return false, nil
	}
	since := now.Add(-s.signals.Config().IdempotencyWindow)
	sess, err := s.store.RetryRegistration(c.Request().Context(), k, keyHash, since, hashSecret(token),
		sessionstore.Touch{VerbAt: now, ExpiresAt: now.Add(s.cfg.SessionTTL)}, now)
	switch {
	case errors.Is(err, sessionstore.ErrNotFound):
		return false, nil
	case err != nil:
		return true, err
	}
	s.metrics.registrations.WithLabelValues("retried").Inc()
	s.log.Info("session registration retried after a lost answer", keyAttrs(sess.Key), "surface", sess.Surface,
		"runtime_mode", sess.RuntimeMode)
	return true, c.JSON(http.StatusCreated, s.sessionResponse(sess, token))
}

func (s *Server) sessionResponse(sess sessionstore.Session, token string) sessionResponse {
	r := sessionResponse{
		SessionID: sess.SessionID, Token: token, TenantID: sess.TenantID, ProjectID: sess.ProjectID,
		Surface: sess.Surface, RuntimeMode: sess.RuntimeMode, RuntimeModeSource: sess.RuntimeModeSource,
		InstanceID:   s.cfg.InstanceID,
		RegisteredAt: sess.RegisteredAt.UTC(), ExpiresAt: sess.ExpiresAt.UTC(),
		HeartbeatIntervalSeconds: int(s.cfg.HeartbeatInterval / time.Second),
	}
	if fabric.Mode(sess.RuntimeMode) == fabric.ModeSticky && sess.AssignedInstance != "" {
		r.InstanceID = sess.AssignedInstance
		if u := s.placer.URL(sess.AssignedInstance); u != "" {
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
}

// heartbeat is POST /v1/heartbeat: proof of life, expiry extended, and the
// caller's pending signals when it has no attached queue.
func (s *Server) heartbeat(c echo.Context) error {
	sess := session(c)
	ctx := c.Request().Context()
	now := s.now()
	sess, err := s.heartbeatTouch(ctx, sess, now)
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
	sess := session(c)
	err := s.store.DeleteSession(c.Request().Context(), sess.Key)
	if err != nil && !errors.Is(err, sessionstore.ErrNotFound) {
		return err
	}
	s.tokens.drop(tokenHash(c))
	// A place is free again in this project: no need to wait for a recount.
	s.projectRooms.forget(TenantProject{TenantID: sess.TenantID, ProjectID: sess.ProjectID})
	s.conns.Kick(sess.Key, conns.DisconnectDeregistered)
	s.log.Info("session deregistered", keyAttrs(sess.Key))
	return c.NoContent(http.StatusNoContent)
}

// touchVerb records an authenticated call as proof of life, at most once per
// TouchInterval per session (the loaded session says when it was last written).
func (s *Server) touchVerb(c echo.Context, sess sessionstore.Session) {
	now := s.now()
	if now.Sub(sess.LastVerbAt) < s.cfg.TouchInterval {
		return
	}
	t := sessionstore.Touch{VerbAt: now, ExpiresAt: now.Add(s.cfg.SessionTTL)}
	err := s.store.TouchSession(c.Request().Context(), sess.Key, t, now)
	if err != nil {
		s.log.Debug("touch verb", keyAttrs(sess.Key), "err", err)
		return
	}
	s.tokens.touched([32]byte(tokenHash(c)), t)
}
