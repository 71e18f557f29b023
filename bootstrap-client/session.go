package bootstrap

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/marconihub/marconi"
)

// maxAnswer bounds how much of one HTTP answer the client reads: a drain or
// piggyback page of 50 signals of 64 KiB each fits with room to spare.
const maxAnswer = 16 << 20

// drainLimit is the page size of GET /v1/signals.
const drainLimit = 50

// do performs one JSON call on the hub in use with the given bearer
// credential. A non-2xx answer comes back as *Error; out is filled from a 2xx
// body. When the hub cannot be reached or answers 502, 503 or 504, the next
// call goes to the next URL (failover).
func (c *Client) do(ctx context.Context, method, path, bearer string, header http.Header, in, out any) (int, error) {
	base, i := c.hub()
	status, err := c.doAt(ctx, base, method, path, bearer, header, in, out)
	if unavailable(err) && ctx.Err() == nil {
		c.failover(i, err)
	}
	return status, err
}

// errNoAnswer marks a call whose answer never arrived: the connection
// failed before or after the hub acted on it.
var errNoAnswer = errors.New("no answer from the hub")

// unavailable reports whether err says the hub in use could not answer: the
// connection failed (the answer, if any, is lost) or it answered 502, 503 or
// 504. Another instance, or the same one a little later, may answer.
func unavailable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, errNoAnswer) {
		return true
	}
	var he *Error
	if !errors.As(err, &he) {
		return false
	}
	switch he.Status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

func (c *Client) doAt(ctx context.Context, base, method, path, bearer string, header http.Header, in, out any) (int, error) {
	var body io.Reader
	switch v := in.(type) {
	case nil:
	case encodedBody:
		body = bytes.NewReader(v)
	default:
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("bootstrap: encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return 0, fmt.Errorf("bootstrap: %s %s: %w", method, path, err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header["Authorization"] = c.authorization(bearer)
	if p := c.project.Load(); p != nil {
		req.Header[marconi.HeaderProject] = *p
	}
	if in != nil {
		req.Header["Content-Type"] = jsonContentType
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("bootstrap: %s %s: %w: %w", method, base+path, errNoAnswer, err)
	}
	defer resp.Body.Close()
	buf := answerBufs.Get().(*bytes.Buffer)
	defer putAnswerBuf(buf)
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, maxAnswer)); err != nil {
		return resp.StatusCode, fmt.Errorf("bootstrap: read answer to %s %s: %w: %w", method, base+path, errNoAnswer, err)
	}
	data := buf.Bytes()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		he := decodeError(resp.StatusCode, data)
		he.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		return resp.StatusCode, he
	}
	if out != nil && len(data) > 0 {
		if d, ok := out.(answerDecoder); ok {
			err = d.decodeAnswer(data)
		} else {
			err = json.Unmarshal(data, out)
		}
		if err != nil {
			return resp.StatusCode, fmt.Errorf("bootstrap: decode answer to %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// encodedBody is a request body encoded already (appendSendRequest), which
// doAt sends as it is.
type encodedBody []byte

// answerDecoder is an answer that decodes itself (fastjson.go) rather than
// through encoding/json's reflection. What it keeps of data is copied:
// data's buffer is reused.
type answerDecoder interface {
	decodeAnswer(data []byte) error
}

// jsonContentType is the Content-Type of every body the client sends; the
// request's header holds it as it is, never changed.
var jsonContentType = []string{"application/json"}

// answerBufs are the buffers answers are read into; one larger than
// maxPooledAnswer (a drain of large payloads) is left to the GC.
var answerBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

const maxPooledAnswer = 64 << 10

func putAnswerBuf(b *bytes.Buffer) {
	if b.Cap() > maxPooledAnswer {
		return
	}
	b.Reset()
	answerBufs.Put(b)
}

// authorization is the Authorization header's value for the bearer
// credential: the last one is kept, so that the calls of one token share
// it rather than build it each.
func (c *Client) authorization(bearer string) []string {
	if a := c.lastAuthorization.Load(); a != nil && a.bearer == bearer {
		return a.header
	}
	a := &authorizationHeader{bearer: bearer, header: []string{"Bearer " + bearer}}
	c.lastAuthorization.Store(a)
	return a.header
}

// authorizationHeader is a bearer credential and its header's value.
type authorizationHeader struct {
	bearer string
	header []string
}

// sessionCall performs a call with the session token. When the token turned
// out to be rotated meanwhile by a resume (401), or the session is gone (410
// session_expired, after which the same session_id is registered again), the
// call is made once more with the new token.
func (c *Client) sessionCall(ctx context.Context, method, path string, in, out any) (auth, error) {
	return c.sessionCallAt(ctx, "", method, path, in, out)
}

// sessionCallAt is sessionCall on base, a URL the hub named, or on the hub in
// use (with its failover) when base is "". A re-registration goes to the hub.
func (c *Client) sessionCallAt(ctx context.Context, base, method, path string, in, out any) (auth, error) {
	reregistered := false
	for attempt := 1; ; attempt++ {
		a := c.currentAuth()
		var err error
		if base == "" {
			_, err = c.do(ctx, method, path, a.token, nil, in, out)
		} else {
			_, err = c.doAt(ctx, base, method, path, a.token, nil, in, out)
		}
		var he *Error
		if err == nil || attempt == maxCallAttempts || !errors.As(err, &he) {
			return a, err
		}
		switch {
		case he.Status == http.StatusUnauthorized && c.tokenRotated(a.token):
			continue
		case he.Code == marconi.CodeSessionExpired && !reregistered:
			reregistered = true
			if rerr := c.reregister(ctx, a.token); rerr != nil {
				return a, errors.Join(err, rerr)
			}
			continue
		}
		return a, err
	}
}

// tokenRotated reports whether a resume replaced token, waiting for a
// registration under way: the hub may have rotated the token before the
// client has read the answer.
func (c *Client) tokenRotated(token string) bool {
	c.regMu.Lock()
	//lint:ignore SA2001 the lock is taken only to wait for a registration in flight
	c.regMu.Unlock()
	return c.currentAuth().token != token
}

// maxCallAttempts bounds how often one session call is made when the token
// keeps changing under it.
const maxCallAttempts = 3

// register makes the client's first registration, at Dial: a resume with the
// token kept in Config.TokenStore when there is one (X-Marconi-Session-Token),
// else a registration of the configured id. A kept token of a session the hub
// no longer knows becomes a registration of the same id (the hub answers the
// resume 201; an answer 410 is registered again), counted and told to the
// application as a re-registration; a registration refused because the id is
// live (403) becomes a takeover when Config.Takeover says so. The new token is
// kept, with the project the hub named, which wins over a kept one.
func (c *Client) register(ctx context.Context) error {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	id := c.sessionID
	c.mu.Unlock()
	token := c.keptToken
	c.keptToken = ""
	res, status, err := c.postRegister(ctx, id, token, false)
	var he *Error
	if token != "" && errors.As(err, &he) && he.Code == marconi.CodeSessionExpired {
		res, status, err = c.postRegister(ctx, id, "", false)
	}
	if c.cfg.Takeover && id != "" && errors.As(err, &he) && he.Status == http.StatusForbidden {
		c.log.Warn("marconi: session is live under a token this client does not hold; taking it over", "session_id", id)
		c.regKey = "" // another registration: the refused one stored nothing
		res, status, err = c.postRegister(ctx, id, "", true)
	}
	if err != nil {
		return c.liveHint(err, id)
	}
	kept := c.project.Load()
	c.adopt(res, status == http.StatusCreated)
	if now := c.project.Load(); kept != nil && (*now)[0] != (*kept)[0] {
		c.log.Info("marconi: the hub names another project than the kept token's; following the hub's", "session_id", res.SessionID, "kept", (*kept)[0], "project", (*now)[0])
	}
	if token != "" && status == http.StatusCreated {
		// The kept token named a session the hub no longer has: what was
		// sent to it is gone with it, as after a 410 while running.
		c.reregistrations.Add(1)
		c.log.Warn(msgKeptSessionGone, "session_id", res.SessionID)
		c.enqueue(ctx, delivery{affinityReset: true, epoch: c.currentAuth().epoch})
	}
	if res.TakenOver {
		c.takeovers.Add(1)
		c.log.Warn("marconi: session taken over; its former holder's token stopped working", "session_id", res.SessionID)
		// Whatever the session held at runtime belonged to the former
		// holder: the application is told before any signal.
		c.enqueue(ctx, delivery{affinityReset: true, epoch: c.currentAuth().epoch})
	}
	return c.keep(ctx)
}

// liveHint adds to the hub's refusal of a live id at Dial (403) which of the
// client's settings brings the session back: the hub's message names a header
// and a JSON field, which a Go application never sets itself. The hub's
// *Error stays reachable with errors.As.
func (c *Client) liveHint(err error, id string) error {
	var he *Error
	if id == "" || c.cfg.Takeover || !errors.As(err, &he) || he.Code != marconi.CodeForbidden {
		return err
	}
	if c.cfg.TokenStore == nil {
		return fmt.Errorf("%w (another process holds session %q, or this one kept no token: set Config.TokenStore "+
			"so that a restart resumes the session, or Config.Takeover to take it over)", err, id)
	}
	return fmt.Errorf("%w (another process holds session %q, or the token in Config.TokenStore is no longer "+
		"current: stop the other one, or set Config.Takeover to take the session over)", err, id)
}

// msgSessionGone and msgKeptSessionGone say that the hub no longer had the
// session (its TTL passed, it was deregistered, or a hub on the in-memory
// store restarted) and that the id was registered anew: the signals the old
// session held are not delivered.
const (
	msgSessionGone     = "marconi: the hub no longer has the session (expired, deregistered, or a hub on the in-memory store restarted); registered the id again, and what the old session held is not delivered"
	msgKeptSessionGone = "marconi: the kept token's session is gone (expired, deregistered, or a hub on the in-memory store restarted); registered the id anew, and what was sent to the old session is not delivered"
)

// errEnding is why a call answered 410 during Deregister is not made again.
var errEnding = errors.New("bootstrap: the session is being deregistered; not registering it again")

// reregister registers the session_id again after the hub answered 410
// session_expired to a call made with token stale. Only the first of several
// concurrent callers registers; the others find the token changed and return.
// The WebSocket of the old registration is closed so the supervisor attaches
// anew right away. While Deregister is under way it registers nothing and
// returns errEnding.
func (c *Client) reregister(ctx context.Context, stale string) error {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	id, token, ending := c.sessionID, c.token, c.ending
	c.mu.Unlock()
	if ending {
		// Deregister ended the session on purpose: a call that raced it
		// (a heartbeat, a drain) must not bring it back.
		return errEnding
	}
	if token != stale {
		return nil
	}
	res, status, err := c.postRegister(ctx, id, "", false)
	if err != nil {
		return fmt.Errorf("bootstrap: register session %s again: %w", id, err)
	}
	c.adopt(res, status == http.StatusCreated)
	c.reregistrations.Add(1)
	c.log.Warn(msgSessionGone, "session_id", res.SessionID)
	if err := c.keep(ctx); err != nil {
		c.log.Error("marconi: could not keep the new session token; a restart will not resume it", "session_id", res.SessionID, "err", err)
	}
	c.mu.Lock()
	conn := c.conn
	c.immediate = true
	c.mu.Unlock()
	if conn != nil {
		_ = conn.CloseNow() // it belongs to the registration that is gone
	}
	return nil
}

// postRegister makes one registration (a resume when token is set, a
// takeover when takeover is). Its attempts carry one Idempotency-Key, kept
// until a registration is answered (adopt), and when an answer is lost or the
// hub answers 502, 503 or 504 it registers again with it, through the next
// hub URL, up to Config.SendAttempts times: the hub answers a retry of a
// registration it made with a new token. A 429 is waited out
// (Config.RateLimitWait). The caller holds regMu.
func (c *Client) postRegister(ctx context.Context, id, token string, takeover bool) (marconi.SessionAnswer, int, error) {
	if c.regKey == "" {
		c.regKey = newRegistrationKey()
	}
	h := http.Header{marconi.HeaderIdempotencyKey: {c.regKey}}
	if token != "" {
		h.Set(marconi.HeaderSessionToken, token)
	}
	req := registerRequest{SessionID: id, Surface: c.cfg.Surface, RuntimeMode: c.cfg.RuntimeMode, ClientID: c.cfg.ClientID, Takeover: takeover}
	var limit rateLimit
	for attempt := 0; ; {
		var res marconi.SessionAnswer
		status, err := c.do(ctx, http.MethodPost, "/v1/sessions", c.cfg.APIKey, h, req, &res)
		if err == nil && res.Token == "" {
			err = fmt.Errorf("bootstrap: register answered %d without a token", status)
		}
		if err == nil {
			return res, status, nil
		}
		retry, stop := c.waitRateLimit(ctx, &limit, err)
		if stop != nil {
			return marconi.SessionAnswer{}, 0, stop
		}
		if retry {
			continue
		}
		if attempt+1 >= c.cfg.SendAttempts || !unavailable(err) {
			return res, status, err
		}
		c.log.Info("marconi: registration got no answer; registering again with the same idempotency key",
			"session_id", id, "attempt", attempt+1, "err", err)
		if werr := c.retryWait(ctx, attempt, err); werr != nil {
			return marconi.SessionAnswer{}, 0, werr
		}
		attempt++
	}
}

// rateLimit is what one call has spent waiting out 429 answers.
type rateLimit struct {
	waits int           // 429s waited out
	spent time.Duration // time waited in all
}

// waitRateLimit waits out err when it is a 429 whose wait fits in what is left
// of the call's budget (Config.RateLimitWait) and of ctx's deadline: the wait
// is the Retry-After with up to a quarter more of jitter (callers the same
// second refused come back spread), or the reconnect backoff when the header
// is missing or unreadable, except on quota_exceeded, where the hub sends
// none when waiting does not help (live sessions per project). retry says
// the call is to be made again; stop is set when ctx ended (joined with err)
// or the client closed while waiting.
func (c *Client) waitRateLimit(ctx context.Context, l *rateLimit, err error) (retry bool, stop error) {
	var he *Error
	if !errors.As(err, &he) || he.Status != http.StatusTooManyRequests {
		return false, nil
	}
	left := c.cfg.RateLimitWait - l.spent
	if dl, ok := ctx.Deadline(); ok {
		left = min(left, time.Until(dl))
	}
	d := he.RetryAfter
	if d <= 0 && he.Code == marconi.CodeQuotaExceeded {
		return false, nil // a quota with no Retry-After: the hub says waiting does not help
	}
	if d <= 0 {
		d = c.backoff.ceiling(l.waits)/2 + c.backoff.delay(l.waits)/2
	} else if d <= left {
		d = min(d+time.Duration(c.backoff.int63n(int64(d/4)+1)), left)
	}
	if d > left {
		return false, nil // longer than the caller can wait: the 429 is the answer
	}
	l.waits++
	l.spent += d
	c.rateLimited.Add(1)
	c.log.Info("marconi: hub asks to wait (429); retrying after it", "code", he.Code, "wait", d, "retry_after", he.RetryAfter)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, errors.Join(err, ctx.Err())
	case <-c.ctx.Done():
		return false, errClosed
	case <-t.C:
		return true, nil
	}
}

// retryWait waits the backoff before the attempt after attempt of a call
// whose answer was lost (err): nil once waited, err joined with ctx's error
// when ctx ends, errClosed when the client closes.
func (c *Client) retryWait(ctx context.Context, attempt int, err error) error {
	t := time.NewTimer(c.backoff.delay(attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return errors.Join(err, ctx.Err())
	case <-c.ctx.Done():
		return errClosed
	case <-t.C:
		return nil
	}
}

// adopt takes a registration answer as the client's current session. A new
// registration (created) starts a new epoch: the hub numbers its signals
// afresh; so does the client's first registration, a resume included. The
// caller holds regMu.
func (c *Client) adopt(res marconi.SessionAnswer, created bool) {
	c.regKey = "" // answered: the next registration is another one
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessionID = res.SessionID
	c.token = res.Token
	c.registration = registrationOf(res)
	if v := marconi.ProjectRoute(res.TenantID, res.ProjectID); v != "" {
		c.project.Store(&[]string{v})
	}
	if created || c.epoch == 0 {
		c.epoch++
	}
	if res.HeartbeatIntervalSeconds > 0 {
		c.hbEvery = time.Duration(res.HeartbeatIntervalSeconds) * time.Second
	}
}

// loadToken reads Config.TokenStore at Dial: a kept token of the configured
// session (or of any, when none is configured) is resumed with.
func (c *Client) loadToken(ctx context.Context) error {
	if c.cfg.TokenStore == nil {
		return nil
	}
	t, err := c.cfg.TokenStore.Load(ctx)
	if errors.Is(err, ErrProjectDropped) {
		// A hint lost, not the token: resume, and name the project once the
		// hub has answered.
		c.log.Warn(msgKeptProjectUnusable, "session_id", t.SessionID, "err", err)
		t.TenantID, t.ProjectID, err = "", "", nil
	}
	if err != nil {
		return fmt.Errorf("bootstrap: load the kept session token: %w", err)
	}
	if t.Token == "" || (c.cfg.SessionID != "" && t.SessionID != c.cfg.SessionID) {
		return nil
	}
	c.sessionID, c.keptToken = t.SessionID, t.Token
	c.keptProject(t)
	return nil
}

// msgKeptProjectUnusable is the warning of a kept tenant or project that
// cannot be named to the balancer: not a string, or not an id of the
// contract.
const msgKeptProjectUnusable = "marconi: the kept token's tenant or project is not an id of the contract; resuming without naming the project to the balancer until the hub answers"

// keptProject names the kept token's project (X-Marconi-Project) from the
// resume on, so that a balancer hashing on it sends the restarted agent to
// its project's instance before the hub has answered. A token kept without
// a project names none until the answer; one kept with a project that is not
// a pair of the contract's ids is never sent, and says so.
func (c *Client) keptProject(t SessionToken) {
	if t.TenantID == "" && t.ProjectID == "" {
		return
	}
	v := marconi.ProjectRoute(t.TenantID, t.ProjectID)
	if v == "" {
		c.log.Warn(msgKeptProjectUnusable,
			"session_id", t.SessionID, "tenant_id", fmt.Sprintf("%.64q", t.TenantID), "project_id", fmt.Sprintf("%.64q", t.ProjectID))
		return
	}
	c.project.Store(&[]string{v})
}

// keep saves the current session, its token and the project the hub last
// named to Config.TokenStore. The caller holds regMu, so saves happen in the
// order the tokens were adopted.
func (c *Client) keep(ctx context.Context) error {
	if c.cfg.TokenStore == nil {
		return nil
	}
	c.mu.Lock()
	t := SessionToken{SessionID: c.sessionID, Token: c.token, TenantID: c.registration.TenantID, ProjectID: c.registration.ProjectID}
	c.mu.Unlock()
	if err := c.cfg.TokenStore.Save(ctx, t); err != nil {
		return fmt.Errorf("bootstrap: keep the session token: %w", err)
	}
	return nil
}

// SendOption sets an option of one Send.
type SendOption func(*sendOptions)

type sendOptions struct{ idempotencyKey string }

// WithIdempotencyKey sets the send's idempotency key (at most 256 bytes). The
// hub answers a later send of this session with the same key, within 24 h,
// from the first one (Duplicate true) and stores nothing new. Without it,
// Send generates a key per call.
func WithIdempotencyKey(key string) SendOption {
	return func(o *sendOptions) { o.idempotencyKey = key }
}

// newIdempotencyKey is the key of a Send that names none: "bc-" and a
// UUIDv7 (48 bits of Unix milliseconds, then 74 random bits, increasing
// within this process), in one allocation. Keys that grow with time are
// added at the end of the store's index of each sender's keys
// (signals_sender_key_idx) rather than on a random page of it, which after
// every checkpoint cost nearly every send a full-page image in the WAL
// (docs/benchmarks-history.md, "Time-ordered idempotency keys").
func newIdempotencyKey() string {
	u := uuid.Must(uuid.NewV7()) // fails only if crypto/rand does, which it never does
	var b [3 + 36]byte
	copy(b[:], "bc-")
	hex.Encode(b[3:11], u[0:4])
	b[11] = '-'
	hex.Encode(b[12:16], u[4:6])
	b[16] = '-'
	hex.Encode(b[17:21], u[6:8])
	b[21] = '-'
	hex.Encode(b[22:26], u[8:10])
	b[26] = '-'
	hex.Encode(b[27:39], u[10:16])
	return string(b[:])
}

// newRegistrationKey is the Idempotency-Key of one registration: 192 random
// bits as 32 base64url characters (the hub refuses fewer than 128 bits).
func newRegistrationKey() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return base64.RawURLEncoding.EncodeToString(b)
}

// Send sends a signal to the session to. kind may be empty (the hub's
// default, "signal"); payload is encoded as JSON. Every send carries an
// idempotency key (WithIdempotencyKey, else generated), and when its answer
// is lost or the hub answers 502, 503 or 504 the client sends it again with
// the same key, through the next hub URL, up to Config.SendAttempts times:
// the hub stores it once. A 429 (the session's send rate, a project quota)
// is waited out for its Retry-After and the send made again, within
// Config.RateLimitWait and ctx. The answer is returned as a SendResult; a retry
// that finds its earlier attempt stored says Duplicate. Signals waiting for
// this session that came with it (piggyback) go to OnSignal. When the hub
// says sender_route_stale, Send has already started the reconnect when it
// returns. Errors of the hub are *Error.
func (c *Client) Send(ctx context.Context, to, kind string, payload any, opts ...SendOption) (SendResult, error) {
	if c.ctx.Err() != nil {
		return SendResult{}, errClosed
	}
	var o sendOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.idempotencyKey == "" {
		o.idempotencyKey = newIdempotencyKey()
	}
	raw, err := json.Marshal(payload)
	if err != nil {
		return SendResult{}, fmt.Errorf("bootstrap: encode payload: %w", err)
	}
	req := sendRequest{ToSession: to, Kind: kind, Payload: raw, IdempotencyKey: o.idempotencyKey}
	// Encoded once, for every attempt: a new slice each Send, since the
	// transport may still read an attempt's body after its answer came.
	body := encodedBody(appendSendRequest(make([]byte, 0, len(raw)+len(to)+len(kind)+len(o.idempotencyKey)+64), &req))
	var (
		resp sendResponse
		a    auth
	)
	var limit rateLimit
	for attempt := 0; ; {
		a, err = c.sendCall(ctx, to, body, &resp)
		if err == nil {
			break
		}
		retry, stop := c.waitRateLimit(ctx, &limit, err)
		if stop != nil {
			return SendResult{}, stop
		}
		if retry {
			continue
		}
		if attempt+1 >= c.cfg.SendAttempts || !unavailable(err) {
			break
		}
		c.log.Info("marconi: send got no answer; sending again with the same idempotency key",
			"to_session", to, "attempt", attempt+1, "err", err)
		if werr := c.retryWait(ctx, attempt, err); werr != nil {
			return SendResult{}, werr
		}
		attempt++
	}
	if err != nil {
		return SendResult{}, err
	}
	res := resp.result()
	if len(resp.Pending) > 0 {
		c.offer(pendingPage(resp.Pending, resp.History, a.epoch))
	}
	if res.RecipientRouteStale {
		c.log.Info("marconi: recipient route stale; it repairs on its own next send",
			"to_session", to, "signal_id", res.SignalID, "selfheal_outcome", res.SelfhealOutcome)
	}
	if res.SenderRouteStale {
		c.requestSelfHeal(a.gen)
	}
	return res, nil
}

// Deregister ends the session on the hub (DELETE /v1/session), so it stops
// counting as a live session at once rather than when its TTL runs out, and
// then closes the client as Close does. Signals not yet acknowledged are
// gone with the session. A session the hub no longer knows counts as ended.
// On any other error the client keeps running; Deregister may be called
// again, or Close.
func (c *Client) Deregister(ctx context.Context) error {
	if c.ctx.Err() != nil {
		return errClosed
	}
	c.mu.Lock()
	c.ending = true // the 4410 close that follows is no reason to register again
	c.mu.Unlock()
	var err error
	for attempt := 1; ; attempt++ {
		a := c.currentAuth()
		_, err = c.do(ctx, http.MethodDelete, "/v1/session", a.token, nil, nil, nil)
		var he *Error
		if !errors.As(err, &he) {
			break
		}
		if he.Code == marconi.CodeSessionExpired {
			err = nil // gone already
			break
		}
		if attempt == maxCallAttempts || he.Status != http.StatusUnauthorized || !c.tokenRotated(a.token) {
			break
		}
	}
	if err != nil {
		c.mu.Lock()
		c.ending = false
		c.mu.Unlock()
		return fmt.Errorf("bootstrap: deregister: %w", err)
	}
	return c.Close()
}

// heartbeatLoop proves the session alive every heartbeat interval and hands
// the pending signals of each answer to the dispatcher.
func (c *Client) heartbeatLoop() {
	defer c.wg.Done()
	t := time.NewTimer(c.heartbeatEvery())
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		stopped := c.stopped
		c.mu.Unlock()
		if stopped {
			return // replaced: the newer connection keeps the session alive; refused: pointless
		}
		every := c.heartbeatEvery()
		c.heartbeat(every)
		t.Reset(c.heartbeatEvery())
	}
}

func (c *Client) heartbeatEvery() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hbEvery
}

func (c *Client) heartbeat(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	defer cancel()
	var res heartbeatResponse
	a, err := c.sessionCall(ctx, http.MethodPost, "/v1/heartbeat", nil, &res)
	if err != nil {
		if c.ctx.Err() == nil {
			c.log.Warn("marconi: heartbeat failed", "err", err)
		}
		return
	}
	c.log.Debug("marconi: heartbeat", "route_state", res.RouteState, "pending", len(res.Pending))
	if len(res.Pending) > 0 {
		c.offer(pendingPage(res.Pending, res.History, a.epoch))
	}
}

// drain fetches, while the WebSocket is down, the signals the hub holds for
// this session beyond the highest one delivered.
func (c *Client) drain(ctx context.Context) {
	var res drainResponse
	a, err := c.sessionCall(ctx, http.MethodGet, c.drainPath(), nil, &res)
	if err != nil {
		c.log.Debug("marconi: drain failed", "err", err)
		return
	}
	if len(res.Signals) > 0 || res.HistoryChanged {
		c.offer(drained(res, a.epoch))
	}
}

// seqMark is a seq of one registration (epoch) of the session, under one
// history of the hub's store ("" when the hub names none).
type seqMark struct {
	epoch   uint64
	seq     int64
	history string
}

// drainAfter is the seq a drain asks for signals after, with the store
// history it came under: the highest one handed to OnSignal (or covered by
// a drained page, history.go), or 0 and no history once the session was
// registered again (its signals start from 1 anew; asking after the old
// registration's highest would skip them until the WebSocket attaches).
func (c *Client) drainAfter() seqMark {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.highest.epoch != c.epoch {
		return seqMark{epoch: c.epoch}
	}
	return c.highest
}
