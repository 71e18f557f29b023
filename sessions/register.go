package sessions

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/fabric"
	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/signals"
)

// RegisterRequest is one registration (POST /v1/sessions), authenticated
// by an API key of Project.
type RegisterRequest struct {
	Project Project
	// APIKeyHash is the SHA-256 of the API key that authenticated the
	// request: a retry with the Idempotency-Key must come with the same.
	APIKeyHash []byte
	// SessionID is the id asked for; empty makes a UUID.
	SessionID   string
	Surface     marconi.Surface
	RuntimeMode marconi.RuntimeMode
	ClientID    string
	Hints       Hints
	// Token is the session's current token (X-Marconi-Session-Token), to
	// resume it; empty for none.
	Token string
	// IdempotencyKey is the registration's Idempotency-Key, empty for none.
	IdempotencyKey string
	// Takeover asks to resume the live session SessionID without its
	// token, on the authority of its project's API key; ignored when the
	// service does not allow takeovers.
	Takeover bool
}

// Hints are what the client says of its work, for the adaptive classifier.
type Hints struct {
	LocalState  bool
	SideEffects bool
}

// Outcome is what a registration did.
type Outcome string

// The outcomes, each the result label of marconi_registrations_total.
const (
	// OutcomeCreated: a new session (201).
	OutcomeCreated Outcome = "created"
	// OutcomeResumed: a live session resumed with its current token (200).
	OutcomeResumed Outcome = "resumed"
	// OutcomeRetried: the retry of a registration whose answer was lost (201).
	OutcomeRetried Outcome = "retried"
	// OutcomeTakenOver: a live session resumed without its token, by its
	// project's API key (200, taken_over).
	OutcomeTakenOver Outcome = "taken_over"
)

// Registration is the result of Register: the session as stored and its
// new token, shown once.
type Registration struct {
	Session sessionstore.Session
	Token   string
	Outcome Outcome
}

// Created reports whether the answer is the registration's (201) rather
// than a resume's (200).
func (r Registration) Created() bool {
	return r.Outcome == OutcomeCreated || r.Outcome == OutcomeRetried
}

var clientIDRe = regexp.MustCompile(`^[\x21-\x7e]{1,128}$`)

// MinRegistrationKeyChars is the shortest registration Idempotency-Key:
// 22 base64url characters carry 128 bits. The key can mint the session's
// next token until it is spent, so it must not be guessable.
const MinRegistrationKeyChars = 22

var registrationKeyRe = regexp.MustCompile(fmt.Sprintf(`^[A-Za-z0-9_-]{%d,%d}$`, MinRegistrationKeyChars, signals.MaxIdempotencyKeyBytes))

// validate checks a request's fields, each refusal naming the field.
func (r RegisterRequest) validate() error {
	if r.SessionID != "" && !signals.ValidSessionID(r.SessionID) {
		return marconi.Errorf(marconi.CodeInvalidField, "session_id must match %s", signals.IDForm)
	}
	if !r.Surface.Valid() {
		return marconi.Errorf(marconi.CodeInvalidSurface, "surface %q is not one of %s", r.Surface, marconi.SurfaceNames)
	}
	if r.ClientID != "" && !clientIDRe.MatchString(r.ClientID) {
		return marconi.Errorf(marconi.CodeInvalidField, "client_id must be 1 to 128 printable ASCII characters")
	}
	if r.RuntimeMode != "" {
		if _, err := fabric.NormalizeRuntimeMode(r.RuntimeMode); err != nil {
			if errors.Is(err, fabric.ErrReservedMode) {
				return marconi.Errorf(marconi.CodeReservedRuntimeMode, "runtime_mode %q is reserved and not implemented; use stateless or sticky", r.RuntimeMode)
			}
			return marconi.Errorf(marconi.CodeInvalidRuntimeMode, "runtime_mode %q is unknown; use stateless or sticky", r.RuntimeMode)
		}
	}
	if r.IdempotencyKey != "" && !registrationKeyRe.MatchString(r.IdempotencyKey) {
		return marconi.Errorf(marconi.CodeInvalidField, "Idempotency-Key must be %d to %d base64url characters ([A-Za-z0-9_-]): at least 128 random bits",
			MinRegistrationKeyChars, signals.MaxIdempotencyKeyBytes)
	}
	return nil
}

// Register creates a session, or resumes a live one with its current
// token, or answers the retry of a registration whose answer was lost, or
// takes a live one over by its project's API key (docs/api.md, "Sessions").
// The quota of registrations per second is not spent here: the caller
// spends it first (SpendRegistration), before it reads the request.
func (s *Service) Register(ctx context.Context, req RegisterRequest) (Registration, error) {
	if err := req.validate(); err != nil {
		return Registration{}, err
	}
	reg := registration{RegisterRequest: req, now: s.now(), token: NewToken()}
	if req.IdempotencyKey != "" {
		reg.keyHash = HashToken(req.IdempotencyKey)
	}
	k := sessionstore.Key{TenantID: req.Project.TenantID, ProjectID: req.Project.ProjectID, SessionID: req.SessionID}
	gone := false // a resume found no live session: nothing to retry
	if req.Token != "" && req.SessionID != "" {
		r, err := s.resume(ctx, k, reg)
		switch {
		case err == nil:
			return r, nil
		case errors.Is(err, sessionstore.ErrTokenMismatch):
			if r, done, err := s.retry(ctx, k, reg); done {
				return r, err
			}
			if r, done, err := s.takeOver(ctx, k, reg); done {
				return r, err
			}
			return Registration{}, s.errLive(req.SessionID)
		case !errors.Is(err, sessionstore.ErrNotFound):
			return Registration{}, err
		}
		// Expired or deleted: the id is free again; register anew.
		gone = true
	}
	if req.SessionID != "" && !gone {
		// Before the quota: the session of a lost answer is already counted.
		if r, done, err := s.retry(ctx, k, reg); done {
			return r, err
		}
		// A takeover of an id that is not live is an ordinary registration.
		if r, done, err := s.takeOver(ctx, k, reg); done {
			return r, err
		}
	}
	return s.create(ctx, reg)
}

// registration is a request on its way through Register.
type registration struct {
	RegisterRequest
	now     time.Time
	token   string // the new token
	keyHash []byte // the Idempotency-Key's hash; nil when none
}

func (r registration) touch(ttl time.Duration) sessionstore.Touch {
	return sessionstore.Touch{VerbAt: r.now, ExpiresAt: r.now.Add(ttl)}
}

// errLive is the refusal of a registration of the live session id without
// its current token: it says what to do instead.
func (s *Service) errLive(id string) error {
	if s.cfg.AllowTakeover {
		return marconi.Errorf(marconi.CodeForbidden, "session %q is live; present its current token (X-Marconi-Session-Token) or register with \"takeover\": true", id)
	}
	return marconi.Errorf(marconi.CodeForbidden, "session %q is live; present its current token (X-Marconi-Session-Token)", id)
}

// takeOverAttempts bounds how often a takeover reads the session's token
// again when a resume or another takeover changed it in between.
const takeOverAttempts = 3

// takeOver resumes the live session k without its token, when the request
// asks for it and takeovers are allowed: its token is swapped for a new one
// (compare-and-set on the token read just before, so that a racing resume
// or takeover is never undone silently), the old token stops working, and
// its signals stay. done is false, and nothing changed, when this is not a
// takeover (not asked, not allowed, or no live session k).
func (s *Service) takeOver(ctx context.Context, k sessionstore.Key, reg registration) (r Registration, done bool, err error) {
	if !reg.Takeover || !s.cfg.AllowTakeover {
		return Registration{}, false, nil
	}
	for range takeOverAttempts {
		cur, err := s.store.GetSession(ctx, k, reg.now)
		if errors.Is(err, sessionstore.ErrNotFound) {
			return Registration{}, false, nil
		}
		if err != nil {
			return Registration{}, true, err
		}
		sess, err := s.store.ResumeSession(ctx, k, cur.TokenHash, HashToken(reg.token), reg.touch(s.cfg.SessionTTL), reg.now)
		switch {
		case errors.Is(err, sessionstore.ErrTokenMismatch):
			continue // resumed or taken over meanwhile: read it again
		case errors.Is(err, sessionstore.ErrNotFound):
			return Registration{}, false, nil
		case err != nil:
			return Registration{}, true, err
		}
		s.revoker.Replaced(ctx, sess, cur.TokenHash)
		s.metrics.takeovers.Inc()
		s.log.Info("session taken over by its project's API key", keyAttrs(sess.Key), "surface", sess.Surface, "runtime_mode", sess.RuntimeMode)
		return Registration{Session: sess, Token: reg.token, Outcome: OutcomeTakenOver}, true, nil
	}
	return Registration{}, true, marconi.Errorf(marconi.CodeForbidden,
		"session %q changed hands %d times during this takeover; try again", k.SessionID, takeOverAttempts)
}

// resume swaps the presented token of the live session k for a new one.
func (s *Service) resume(ctx context.Context, k sessionstore.Key, reg registration) (Registration, error) {
	old := HashToken(reg.Token)
	sess, err := s.store.ResumeSession(ctx, k, old, HashToken(reg.token), reg.touch(s.cfg.SessionTTL), reg.now)
	if err != nil {
		return Registration{}, err
	}
	s.revoker.Replaced(ctx, sess, old)
	s.metrics.registrations.WithLabelValues(string(OutcomeResumed)).Inc()
	s.log.Info("session resumed", keyAttrs(sess.Key), "surface", sess.Surface, "runtime_mode", sess.RuntimeMode)
	return Registration{Session: sess, Token: reg.token, Outcome: OutcomeResumed}, nil
}

// retry answers a registration of the live session k that carries the
// Idempotency-Key of the registration that made its current token, with
// the same API key, within the retry window and before that token was
// first used: the retry of a registration whose answer was lost. The
// lost token was never seen and is stored only hashed, so it cannot be sent
// again: the session gets a new token instead, the lost one stops working,
// and the answer is the registration's (201). done is false, and nothing
// changed, when this is not such a retry (no key, another key, too old, no
// live session).
func (s *Service) retry(ctx context.Context, k sessionstore.Key, reg registration) (r Registration, done bool, err error) {
	if reg.keyHash == nil {
		return Registration{}, false, nil
	}
	since := reg.now.Add(-s.cfg.RetryWindow)
	sess, err := s.store.RetryRegistration(ctx, k, reg.keyHash, reg.APIKeyHash, since, HashToken(reg.token), reg.touch(s.cfg.SessionTTL), reg.now)
	switch {
	case errors.Is(err, sessionstore.ErrNotFound):
		return Registration{}, false, nil
	case err != nil:
		return Registration{}, true, err
	}
	s.revoker.Replaced(ctx, sess, nil)
	s.metrics.registrations.WithLabelValues(string(OutcomeRetried)).Inc()
	s.log.Info("session registration retried after a lost answer", keyAttrs(sess.Key), "surface", sess.Surface,
		"runtime_mode", sess.RuntimeMode)
	return Registration{Session: sess, Token: reg.token, Outcome: OutcomeRetried}, true, nil
}

// create stores a new session, within the project's quota.
func (s *Service) create(ctx context.Context, reg registration) (Registration, error) {
	id := reg.SessionID
	if id == "" {
		id = uuid.NewString()
	}
	mode, source := s.classes.RuntimeMode(reg.RuntimeMode, reg.ClientID,
		fabric.Hints{Surface: reg.Surface, LocalState: reg.Hints.LocalState, SideEffects: reg.Hints.SideEffects})
	sess := sessionstore.Session{
		Key:               sessionstore.Key{TenantID: reg.Project.TenantID, ProjectID: reg.Project.ProjectID, SessionID: id},
		Surface:           reg.Surface,
		RuntimeMode:       mode,
		RuntimeModeSource: source,
		ClientID:          reg.ClientID,
		TokenHash:         HashToken(reg.token),
		// The key's hash, never the key: it is a secret that can mint a token.
		RegistrationKeyHash: reg.keyHash,
		RegisteredAt:        reg.now,
		ExpiresAt:           reg.now.Add(s.cfg.SessionTTL),
	}
	if reg.keyHash != nil {
		sess.RegistrationAPIKeyHash = reg.APIKeyHash
	}
	// Count and create under the project's lock, so that this instance's
	// concurrent registrations cannot pass the quota together.
	unlock, err := s.newSessions.lock(ctx, reg.Project)
	if err != nil {
		return Registration{}, err
	}
	defer unlock()
	if err := s.checkSessionQuota(ctx, reg.Project); err != nil {
		return Registration{}, err
	}
	if mode == fabric.ModeSticky {
		inst, err := s.placer.Assign(ctx, reg.Project.TenantID, reg.Project.ProjectID)
		if err != nil {
			return Registration{}, err
		}
		sess.AssignedInstance = inst
	}
	sess, err = s.store.CreateSession(ctx, sess, reg.now)
	if errors.Is(err, sessionstore.ErrConflict) {
		return Registration{}, s.errLive(id)
	}
	if err != nil {
		return Registration{}, err
	}
	if source == fabric.SourceAdaptive {
		s.classes.CountAdaptivePlacement(ctx)
	}
	s.metrics.registrations.WithLabelValues(string(OutcomeCreated)).Inc()
	s.log.Info("session registered", keyAttrs(sess.Key), "surface", sess.Surface, "runtime_mode", sess.RuntimeMode,
		"runtime_mode_source", sess.RuntimeModeSource, "assigned_instance", sess.AssignedInstance)
	return Registration{Session: sess, Token: reg.token, Outcome: OutcomeCreated}, nil
}

// SpendRegistrationKey spends the Idempotency-Key of the registration that
// made sess's token, if it is still unspent: sess is the session a request
// just authenticated with that token, and its first authenticated use ends
// the registration's retries. It returns sess as it is then.
func (s *Service) SpendRegistrationKey(ctx context.Context, sess sessionstore.Session) (sessionstore.Session, error) {
	if sess.RegistrationKeyHash == nil {
		return sess, nil
	}
	if err := s.store.SpendRegistrationKey(ctx, sess.Key, sess.TokenHash); err != nil {
		return sess, err
	}
	sess.RegistrationKeyHash, sess.RegistrationAPIKeyHash = nil, nil
	return sess, nil
}

// Heartbeat records the proof of life of session k, whose caller is h,
// and extends its expiry; it returns the new expiry. A session no longer
// live, or no longer h's (registered again or resumed since h
// authenticated), is session_expired, and nothing is written.
func (s *Service) Heartbeat(ctx context.Context, k sessionstore.Key, h sessionstore.Holder) (time.Time, error) {
	now := s.now()
	// The stores keep microseconds: the expiry answered is the one kept.
	exp := now.Add(s.cfg.SessionTTL).Truncate(time.Microsecond)
	if err := s.store.TouchSessionAs(ctx, k, h, sessionstore.Touch{SeenAt: now, VerbAt: now, ExpiresAt: exp}, now); err != nil {
		if errors.Is(err, sessionstore.ErrNotFound) {
			return time.Time{}, marconi.Errorf(marconi.CodeSessionExpired, "this session expired; register again")
		}
		return time.Time{}, err
	}
	return exp, nil
}

// Deregister ends sess, the caller's own session (DELETE /v1/session):
// its token stops working and its WebSockets close with 4410. A session
// already gone is not an error.
func (s *Service) Deregister(ctx context.Context, sess sessionstore.Session) error {
	err := s.store.DeleteSession(ctx, sess.Key)
	if err != nil && !errors.Is(err, sessionstore.ErrNotFound) {
		return err
	}
	s.ended(ctx, sess)
	s.log.Info("session deregistered", keyAttrs(sess.Key))
	return nil
}

// End ends the session k for an operator (the dashboard's action), live
// or expired and not yet pruned: not_found when there is none.
func (s *Service) End(ctx context.Context, k sessionstore.Key) error {
	sess, err := s.store.GetSession(ctx, k, s.now())
	switch {
	case errors.Is(err, sessionstore.ErrNotFound):
		sess = sessionstore.Session{Key: k} // expired: nothing attached to close
	case err != nil:
		return err
	}
	err = s.store.DeleteSession(ctx, k)
	if errors.Is(err, sessionstore.ErrNotFound) {
		return marconi.Errorf(marconi.CodeNotFound, "no live session %s/%s/%s", k.TenantID, k.ProjectID, k.SessionID)
	}
	if err != nil {
		return err
	}
	s.ended(ctx, sess)
	s.log.Info("session deregistered by an operator", keyAttrs(k))
	return nil
}

// ended tells what follows the end of sess: a place is free again in its
// project (no need to wait for a recount), and its token stops working.
func (s *Service) ended(ctx context.Context, sess sessionstore.Session) {
	s.rooms.forget(Project{TenantID: sess.TenantID, ProjectID: sess.ProjectID})
	s.revoker.Ended(ctx, sess)
}
