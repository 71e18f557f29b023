package hub

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessions"
	"github.com/marconihub/marconi/sessionstore"
)

// Credential prefixes tell the kinds apart, so a credential of the wrong kind
// is refused before any lookup.
const (
	prefixSessionToken = sessions.TokenPrefix
	prefixAPIKey       = "mak_"
)

// NewSecret returns a fresh credential: prefix and 32 random bytes, base64url.
func NewSecret(prefix string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("hub: crypto/rand failed: " + err.Error())
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// NewAPIKey returns a fresh project API key.
func NewAPIKey() string { return NewSecret(prefixAPIKey) }

// NewAdminToken returns a fresh admin token.
func NewAdminToken() string { return NewSecret("madm_") }

// hashSecret is how every credential is stored: its SHA-256. The secrets are
// 256-bit random values, so a fast hash is enough.
func hashSecret(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// credentials holds the credentials configured at start, hashed.
type credentials struct {
	apiKeys    map[[32]byte]TenantProject
	adminToken []byte // hash; nil when none is configured
}

func newCredentials(apiKeys map[string]TenantProject, adminToken string) *credentials {
	c := &credentials{apiKeys: make(map[[32]byte]TenantProject, len(apiKeys))}
	for k, tp := range apiKeys {
		c.apiKeys[sha256.Sum256([]byte(k))] = tp
	}
	if adminToken != "" {
		c.adminToken = hashSecret(adminToken)
	}
	return c
}

var errUnauthorized = marconi.Errorf(marconi.CodeUnauthorized, "missing or malformed credential")

// bearer returns the bearer credential of the request, or "".
func bearer(c echo.Context) string {
	h := c.Request().Header.Get(echo.HeaderAuthorization)
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(cred)
}

// ctxOwner is where apiKeyAuth leaves the project of the caller's API key.
const ctxOwner = "marconi.api_key_owner"

// apiKeyAuth authenticates the project API key of a request before its body
// is read (withBody), so that a request without a valid key costs no body
// read; the handler's apiKeyOwner then answers from what it found.
func (s *Server) apiKeyAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		tp, err := s.apiKeyOwner(c)
		if err != nil {
			return err
		}
		c.Set(ctxOwner, tp)
		return next(c)
	}
}

// apiKeyOwner authenticates a project API key, or returns the project
// apiKeyAuth authenticated.
func (s *Server) apiKeyOwner(c echo.Context) (TenantProject, error) {
	if tp, ok := c.Get(ctxOwner).(TenantProject); ok {
		return tp, nil
	}
	key := bearer(c)
	if !strings.HasPrefix(key, prefixAPIKey) && !s.creds.isConfiguredKey(key) {
		return TenantProject{}, errUnauthorized
	}
	sum := sha256.Sum256([]byte(key))
	if tp, ok := s.creds.apiKeys[sum]; ok {
		return tp, nil
	}
	k, err := s.store.APIKeyByHash(c.Request().Context(), sum[:])
	if errors.Is(err, sessionstore.ErrNotFound) {
		return TenantProject{}, marconi.Errorf(marconi.CodeUnauthorized, "unknown API key: not in MARCONI_API_KEYS, never made by POST /v1/ops/api_keys, or revoked; ask the hub's operator for a key")
	}
	if err != nil {
		return TenantProject{}, err
	}
	return TenantProject{TenantID: k.TenantID, ProjectID: k.ProjectID}, nil
}

// isConfiguredKey reports whether key is one of MARCONI_API_KEYS, which an
// operator may have written without the mak_ prefix.
func (c *credentials) isConfiguredKey(key string) bool {
	if key == "" {
		return false
	}
	_, ok := c.apiKeys[sha256.Sum256([]byte(key))]
	return ok
}

// sessionAuth authenticates a session token and loads the caller's session
// as it was before this call (the self-heal gates need that). A handler's
// session_expired drops the token from the cache.
func (s *Server) sessionAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return s.authSession(next, false)
}

// sendAuth is sessionAuth for sends: the session may come from the token
// cache, because the send itself is authorised again by the store (see
// tokenCache). A send the store refused for its token drops the entry.
func (s *Server) sendAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return s.authSession(next, true)
}

func (s *Server) authSession(next echo.HandlerFunc, cached bool) echo.HandlerFunc {
	return func(c echo.Context) error {
		token := bearer(c)
		if !strings.HasPrefix(token, prefixSessionToken) {
			return errUnauthorized
		}
		h := sha256.Sum256([]byte(token))
		var sess *sessionstore.Session
		if cached {
			sess, _ = s.tokens.get(h, s.now())
		}
		if sess == nil {
			loaded, err := s.authenticateSessionCtx(c.Request().Context(), token)
			if err != nil {
				return err
			}
			sess = &loaded
			if cached {
				s.tokens.put(h, sess, s.now())
			}
		}
		st := stateOf(c)
		if st == nil {
			return errors.New("hub: session authentication outside storeDeadline")
		}
		st.caller, st.callerTokenHash, st.hasCaller = sess, h, true
		err := next(c)
		if e, ok := errors.AsType[*marconi.Error](err); ok && e.Code == marconi.CodeSessionExpired {
			s.tokens.drop(h[:])
		}
		return err
	}
}

// provesLife records a session's call as its proof of life (last_verb_at)
// once the handler has answered, whatever it answered, at most once per
// TouchInterval. It follows sessionAuth or sendAuth on the routes whose
// handler writes none of its own: not on heartbeats, which do, nor on
// deregistration, which leaves nothing to touch.
func (s *Server) provesLife(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		err := next(c)
		s.touchVerb(c, session(c))
		return err
	}
}

func (s *Server) authenticateSessionCtx(ctx context.Context, token string) (sessionstore.Session, error) {
	if !strings.HasPrefix(token, prefixSessionToken) {
		return sessionstore.Session{}, errUnauthorized
	}
	h := hashSecret(token)
	sess, err := s.store.SessionByToken(ctx, h, s.now())
	if errors.Is(err, sessionstore.ErrNotFound) {
		return sessionstore.Session{}, marconi.Errorf(marconi.CodeSessionExpired, "this session token matches no live session; register again")
	}
	if err != nil {
		return sessionstore.Session{}, err
	}
	if subtle.ConstantTimeCompare(sess.TokenHash, h) != 1 {
		return sessionstore.Session{}, marconi.Errorf(marconi.CodeSessionExpired, "this session token matches no live session; register again")
	}
	// The token is used: the registration that made it can no longer be
	// retried (its Idempotency-Key would otherwise mint the next token).
	return s.sessions.SpendRegistrationKey(ctx, sess)
}

// session returns the caller's session loaded by sessionAuth. Only a
// handler behind sessionAuth or sendAuth may ask.
func session(c echo.Context) sessionstore.Session {
	return *callerState(c).caller
}

// tokenHash returns the SHA-256 of the caller's token, set by sessionAuth.
func tokenHash(c echo.Context) []byte {
	return callerState(c).callerTokenHash[:]
}

// callerState is the request's state once a session is authenticated; it
// panics otherwise, as a route wired without sessionAuth is a bug.
func callerState(c echo.Context) *requestState {
	st := stateOf(c)
	if st == nil || !st.hasCaller {
		panic("hub: a handler asked for the caller's session on a route without sessionAuth")
	}
	return st
}

// adminAuth guards /v1/ops/*.
func (s *Server) adminAuth(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if bearer(c) == "" || s.creds.adminToken == nil {
			return errUnauthorized
		}
		if !s.isAdmin(c) {
			return marconi.Errorf(marconi.CodeUnauthorized, "unknown admin token")
		}
		return next(c)
	}
}

// isAdmin reports whether the request carries the admin token.
func (s *Server) isAdmin(c echo.Context) bool {
	tok := bearer(c)
	return tok != "" && s.creds.adminToken != nil && subtle.ConstantTimeCompare(hashSecret(tok), s.creds.adminToken) == 1
}
