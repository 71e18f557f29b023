package pgstore

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// Wake-up bus: Postgres LISTEN/NOTIFY between the hub instances that share a
// database. Each instance listens on its own channel; the payload names the
// stored signals (tenant, project, session, seq) and nothing else: one
// object, or an array of them when a batch wakes several sessions there.

// channelSQL computes an instance's channel. Channels are database-wide while
// the tables live in the search_path's schema, so the schema is part of the
// name: deployments (and parallel tests) in other schemas of one database
// never hear each other. The md5 keeps any instance id within Postgres's
// 63-byte identifier limit.
const channelSQL = `'marconi_wake_' || md5(coalesce(current_schema(), '') || '/' || $1::text)`

// livenessKeySQL computes the key of an instance's liveness lock: a
// session-level advisory lock that the liveness connection of the
// instance's process (Listen) holds exclusively while it lives, so that two
// processes of one instance id are told apart. Like the channel, the key
// covers the schema.
const livenessKeySQL = `('x' || substr(md5('marconi-liveness/' || coalesce(current_schema(), '') || '/' || $1::text), 1, 16))::bit(64)::bigint`

// processKeySQL computes the key of a process's liveness lock: both
// dedicated connections of the process of instance $1 started at $2 (the
// started_at of its heartbeats, to the microsecond, as stored) hold it,
// shared. Postgres releases it the moment the last of them ends (the
// process was killed, its host lost the database), so the other instances
// see the death within one probe rather than after the heartbeat window,
// while one connection replaced in a live process leaves it held. A process
// restarted with the same instance id has another key, so a lock still held
// by a backend of the process before it (Postgres has not yet seen that
// connection end) is never taken for the new process's: ConnectedInstances
// reads the key of each row's started_at.
const processKeySQL = `('x' || substr(md5('marconi-process/' || coalesce(current_schema(), '') || '/' ||
	(extract(epoch FROM $2::timestamptz) * 1000000)::bigint || '/' || $1::text), 1, 16))::bit(64)::bigint`

// dedicatedSessionSQL turns off, for a dedicated connection's own session,
// every server timeout that would end it while it idles or holds its locks:
// a server, database or role whose idle_session_timeout (or
// transaction_timeout) is under the connections' keep-alive would
// otherwise end both of a process's connections together, and release its
// process lock, a death to its peers. Each call on these connections is
// bounded by the client (listenCallTimeout) instead. A setting the server
// does not have (idle_session_timeout before Postgres 14,
// transaction_timeout before 17) is left out rather than refused.
const dedicatedSessionSQL = `SELECT count(set_config(name, '0', false)) FROM pg_settings
	WHERE name IN ('idle_session_timeout', 'idle_in_transaction_session_timeout', 'transaction_timeout', 'statement_timeout', 'lock_timeout')`

// ListenerApplicationName is the application_name of the listener's
// connection, as pg_stat_activity shows it.
const ListenerApplicationName = "marconi-wake-listener"

// LivenessApplicationName is the application_name of the liveness
// connection that Listen keeps beside the listener's, as pg_stat_activity
// shows it.
const LivenessApplicationName = "marconi-liveness"

// MaxWakePayload bounds a wake-up payload, well under Postgres's 8000 bytes.
const MaxWakePayload = 2048

// maxWakeField bounds each of tenant, project and session id in a payload.
const maxWakeField = 256

// MaxWakeBatchPayload bounds a payload that carries several wake-ups (a JSON
// array, EncodeWakes): under Postgres's limit (a NOTIFY payload must be
// shorter than 8000 bytes) with room to spare. One wake-up of the longest
// valid fields, every byte escaped, takes under 4700 bytes, so it always fits.
const MaxWakeBatchPayload = 7680

// MaxWakeBatch bounds how many wake-ups one payload carries.
const MaxWakeBatch = 128

// Listener timings.
const (
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
	// listenIdleCheck: the listener's connection, when it heard nothing
	// for this long, checks itself, so a half-open one is noticed and
	// replaced. The liveness connection checks itself twice as often
	// (livenessIdleCheck): the two never keep one schedule, so a cut of
	// idle connections (a proxy, a firewall) that falls between the two
	// takes only the listener's, and the process's lock stays held.
	listenIdleCheck   = 30 * time.Second
	livenessIdleCheck = listenIdleCheck / 2
	// listenCallTimeout bounds connecting, LISTEN and the idle check.
	listenCallTimeout = 10 * time.Second
	// livenessRetry is how soon a connection that could not take one of
	// its liveness locks tries again.
	livenessRetry = 500 * time.Millisecond
)

// wakePayload is the JSON of a wake-up. A bare one names the session and
// seq only; one that carries its signal (sessionstore.Wake.Signal) adds
// Sealed, a JSON object (wakeSignal) of the signal and the session's
// incarnation, and Tag, a MAC over the wake-up's session and seq and
// Sealed's bytes as they travel (sealTag), keyed by the database's bus key
// (migration 0008), since any role that can connect may NOTIFY. A receiver
// checks the tag over the bytes it got before it decodes them: a carried
// signal whose tag does not check out is dropped, and the wake-up is a
// bare one.
//
// The names "sealed" and "tag" are new with this form: an instance of the
// form before (which carried "registered_at", "signal" and a "mac" over
// the entry's re-encoded JSON) ignores them, as every instance ignores
// fields it does not know, and so reads a bare wake-up; this form ignores
// that one's, likewise. Mixed versions lose no wake-up, only the carried
// signal, which the holder then reads from the store.
type wakePayload struct {
	Tenant  string `json:"tenant"`
	Project string `json:"project"`
	Session string `json:"session"`
	Seq     *int64 `json:"seq"` // required: nil when the payload has none

	Sealed json.RawMessage `json:"sealed,omitempty"`
	Tag    wakeTag         `json:"tag,omitempty"`
}

// strictBase64 is the tag's encoding as a receiver reads it: standard
// base64 whose padding bits are zero, so that one tag has one text.
var strictBase64 = base64.StdEncoding.Strict()

// wakeTag is a wake-up's tag, read from its one canonical base64 text: any
// other text of the same bytes (non-zero padding bits, line breaks) makes
// the payload malformed, so no altered byte of a sealed wake-up carries.
type wakeTag []byte

// UnmarshalJSON decodes a JSON string of the tag's canonical base64.
func (t *wakeTag) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	d, err := strictBase64.DecodeString(s)
	if err != nil || base64.StdEncoding.EncodeToString(d) != s {
		return errors.New("wake-up tag is not canonical base64")
	}
	*t = d
	return nil
}

// wakeSignal is the sealed part of a wake-up that carries its signal.
// Payload is the sender's JSON text, embedded as it is, so its bytes travel
// unchanged.
type wakeSignal struct {
	RegisteredAt   time.Time       `json:"registered_at"`
	ID             string          `json:"id"`
	From           string          `json:"from"`
	Kind           string          `json:"kind"`
	Payload        json.RawMessage `json:"payload,omitempty"`
	CreatedAt      time.Time       `json:"created_at"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Delivery       string          `json:"delivery"`
	RouteState     string          `json:"route_state"`
}

// Wake is one wake-up (sessionstore.Wake).
type Wake = sessionstore.Wake

// wakeCodec encodes and decodes wake-ups with key, the bus key: without
// one (nil), signals are neither carried nor accepted. prev, when not nil,
// is the key before a rotation: it opens a carried signal too, never seals
// one.
type wakeCodec struct{ key, prev []byte }

// openTally counts the carried signals one decode met: opened under the
// codec's key, under its previous key, and opened under neither (a tag of
// the right size that no key checks: sealed under a key this codec does
// not know, or forged).
type openTally struct{ current, previous, missed int }

// open reports which of the codec's keys makes tag the sealTag of the
// wake-up of k and seq that carries sealed, counting it in t.
func (c wakeCodec) open(t *openTally, k sessionstore.Key, seq int64, sealed, tag []byte) bool {
	switch {
	case hmac.Equal(tag, sealTag(c.key, k, seq, sealed)):
		t.current++
	case c.prev != nil && hmac.Equal(tag, sealTag(c.prev, k, seq, sealed)):
		t.previous++
	default:
		t.missed++
		return false
	}
	return true
}

// EncodeWake is the NOTIFY payload of a bare wake-up for k's signal seq, in
// the object form (EncodeWakes packs several).
func EncodeWake(k sessionstore.Key, seq int64) (string, error) {
	b, err := wakeCodec{}.entry(Wake{Key: k, Seq: seq})
	if err != nil {
		return "", err
	}
	if len(b) > MaxWakePayload {
		return "", fmt.Errorf("wake-up payload of %d bytes is over %d", len(b), MaxWakePayload)
	}
	return string(b), nil
}

// DecodeWake parses a NOTIFY payload. The payload is untrusted (anyone who
// can connect to the database can NOTIFY): anything but one well-formed,
// bounded JSON object naming a session and a seq (positive, or 0 for a
// check wake-up) is an error. Unknown fields are ignored, so that a newer
// instance may add some; a carried signal is ignored too (DecodeWake has no
// key to check it with).
func DecodeWake(payload string) (sessionstore.Key, int64, error) {
	if len(payload) > MaxWakePayload {
		return sessionstore.Key{}, 0, fmt.Errorf("wake-up payload of %d bytes is over %d", len(payload), MaxWakePayload)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(payload)))
	var p wakePayload
	if err := dec.Decode(&p); err != nil {
		return sessionstore.Key{}, 0, fmt.Errorf("malformed wake-up: %w", err)
	}
	if !onlySpace(payload[dec.InputOffset():]) {
		return sessionstore.Key{}, 0, errors.New("malformed wake-up: data after the object")
	}
	if err := p.validate(); err != nil {
		return sessionstore.Key{}, 0, err
	}
	return sessionstore.Key{TenantID: p.Tenant, ProjectID: p.Project, SessionID: p.Session}, *p.Seq, nil
}

// EncodeWakes packs bare wake-ups for wakes, in order, into as few NOTIFY
// payloads as fit (see wakeCodec.encode); carried signals are left out.
func EncodeWakes(wakes []Wake) ([]string, error) { return wakeCodec{}.encode(wakes) }

// DecodeWakes parses a NOTIFY payload of either form (see wakeCodec.decode),
// as bare wake-ups: carried signals are dropped.
func DecodeWakes(payload string) ([]Wake, error) { return wakeCodec{}.decode(payload) }

// encode packs wakes, in order, into as few NOTIFY payloads as fit, each of
// at most MaxWakeBatchPayload bytes and MaxWakeBatch wake-ups. A payload of
// one wake-up is the object form when that fits MaxWakePayload, which
// instances older than the array form understand; any other is a JSON array
// of such objects. A wake-up carries its signal when the codec has a key and
// the entry fits one payload; otherwise it goes bare. It refuses wakes that
// decode would refuse.
func (c wakeCodec) encode(wakes []Wake) ([]string, error) {
	var (
		payloads []string
		entries  []string
		size     = 1 // the array's "[", and "," or "]" after each entry
	)
	flush := func() {
		if len(entries) == 1 && len(entries[0]) <= MaxWakePayload {
			payloads = append(payloads, entries[0])
		} else if len(entries) > 0 {
			payloads = append(payloads, "["+strings.Join(entries, ",")+"]")
		}
		entries, size = entries[:0], 1
	}
	for _, w := range wakes {
		b, err := c.entry(w)
		if err != nil {
			return nil, err
		}
		if len(entries) == MaxWakeBatch || size+len(b)+1 > MaxWakeBatchPayload {
			flush()
		}
		entries, size = append(entries, string(b)), size+len(b)+1
	}
	flush()
	return payloads, nil
}

// entry is the JSON object of w, the bytes json.Marshal writes for its
// wakePayload (wakecodec_internal_test.go holds the two to the same bytes): with
// its signal sealed when the codec has a key and the object fits a payload
// on its own, else bare.
func (c wakeCodec) entry(w Wake) ([]byte, error) {
	if err := validateWake(w.Key, w.Seq); err != nil {
		return nil, err
	}
	dst := make([]byte, 0, 128)
	dst = append(dst, `{"tenant":`...)
	dst = appendJSONString(dst, w.Key.TenantID)
	dst = append(dst, `,"project":`...)
	dst = appendJSONString(dst, w.Key.ProjectID)
	dst = append(dst, `,"session":`...)
	dst = appendJSONString(dst, w.Key.SessionID)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, w.Seq, 10)
	if c.key != nil && w.Signal != nil && w.Signal.Seq == w.Seq && w.Signal.To == w.Key {
		bare := len(dst)
		dst = append(dst, `,"sealed":`...)
		var ok bool
		sealed := len(dst)
		if dst, ok = appendWakeSignal(dst, w.Signal, w.Incarnation); ok {
			tag := sealTag(c.key, w.Key, w.Seq, dst[sealed:])
			dst = append(dst, `,"tag":"`...)
			dst = base64.StdEncoding.AppendEncode(dst, tag)
			dst = append(dst, `"}`...)
			if len(dst) < MaxWakeBatchPayload-1 {
				return dst, nil
			}
		}
		dst = dst[:bare]
	}
	return append(dst, '}'), nil
}

// appendWakeSignal appends the sealed part of a wake-up that carries sig
// for the session of incarnation inc: the bytes json.Marshal writes for its
// wakeSignal, with the payload as it is. ok is false when it cannot carry
// them so: a time json cannot write, or a payload that is not one valid
// UTF-8 JSON value without surrounding space (which would not travel
// unchanged).
func appendWakeSignal(dst []byte, sig *sessionstore.Signal, inc time.Time) (_ []byte, ok bool) {
	if !jsonTime(inc) || !jsonTime(sig.CreatedAt) {
		return dst, false
	}
	if p := sig.Payload; p != nil {
		if len(p) == 0 || strings.ContainsRune(jsonSpace, rune(p[0])) || strings.ContainsRune(jsonSpace, rune(p[len(p)-1])) ||
			!utf8.Valid(p) || !json.Valid(p) {
			return dst, false
		}
	}
	dst = append(dst, `{"registered_at":"`...)
	dst = inc.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, `","id":`...)
	dst = appendJSONString(dst, sig.ID)
	dst = append(dst, `,"from":`...)
	dst = appendJSONString(dst, sig.FromSession)
	dst = append(dst, `,"kind":`...)
	dst = appendJSONString(dst, sig.Kind)
	if sig.Payload != nil {
		dst = append(dst, `,"payload":`...)
		dst = append(dst, sig.Payload...)
	}
	dst = append(dst, `,"created_at":"`...)
	dst = sig.CreatedAt.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, '"')
	if sig.IdempotencyKey != "" {
		dst = append(dst, `,"idempotency_key":`...)
		dst = appendJSONString(dst, sig.IdempotencyKey)
	}
	dst = append(dst, `,"delivery":`...)
	dst = appendJSONString(dst, string(sig.Delivery))
	dst = append(dst, `,"route_state":`...)
	dst = appendJSONString(dst, string(sig.RouteState))
	return append(dst, '}'), true
}

// jsonTime reports whether t's year is one time.Time's MarshalJSON writes.
func jsonTime(t time.Time) bool {
	y := t.UTC().Year()
	return y >= 0 && y <= 9999
}

// hexDigits are the digits of a \u escape.
const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string, escaped as json.Marshal
// escapes it (HTML characters, U+2028 and U+2029 too; invalid UTF-8 becomes
// U+FFFD).
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// sealTagDomain opens every tag's input, so that no other use of the bus
// key can produce one.
const sealTagDomain = "marconi wake-up sealed v2\x00"

// sealTag is the HMAC-SHA256, under key, of the wake-up of k and seq that
// carries sealed: its input is sealTagDomain, each of k's ids after its
// length (two bytes, big-endian; an id has at most maxWakeField bytes), seq
// (eight bytes, big-endian), then sealed's bytes, so that neither the
// sealed part nor the wake-up it belongs to can change.
func sealTag(key []byte, k sessionstore.Key, seq int64, sealed []byte) []byte {
	h := macs.get(key)
	defer macs.put(h)
	in := append(h.in[:0], sealTagDomain...)
	for _, id := range [...]string{k.TenantID, k.ProjectID, k.SessionID} {
		in = binary.BigEndian.AppendUint16(in, uint16(len(id)))
		in = append(in, id...)
	}
	in = binary.BigEndian.AppendUint64(in, uint64(seq))
	h.in = in
	h.h.Write(in)
	h.h.Write(sealed)
	return h.h.Sum(nil)
}

// keyedMAC is a reusable HMAC-SHA256 under key, with a buffer for the
// start of its input.
type keyedMAC struct {
	key []byte
	h   hash.Hash
	in  []byte
}

// macPool keeps keyedMACs, since hmac.New costs two hashes' allocations
// and a key schedule per call.
type macPool struct{ p sync.Pool }

var macs macPool

// get returns an HMAC under key, reset.
func (m *macPool) get(key []byte) *keyedMAC {
	if k, _ := m.p.Get().(*keyedMAC); k != nil && bytes.Equal(k.key, key) {
		k.h.Reset()
		return k
	}
	return &keyedMAC{key: key, h: hmac.New(sha256.New, key)}
}

func (m *macPool) put(k *keyedMAC) { m.p.Put(k) }

// carried returns the signal p carries when its tag checks out under one
// of the codec's keys (counted in t), over the sealed bytes as received,
// and they are well formed; else nil (a bare wake-up).
func (c wakeCodec) carried(t *openTally, p wakePayload) (*sessionstore.Signal, time.Time) {
	if c.key == nil || p.Sealed == nil || len(p.Tag) != sha256.Size {
		return nil, time.Time{}
	}
	k := sessionstore.Key{TenantID: p.Tenant, ProjectID: p.Project, SessionID: p.Session}
	if !c.open(t, k, *p.Seq, p.Sealed, p.Tag) {
		return nil, time.Time{}
	}
	var ws wakeSignal
	if err := json.Unmarshal(p.Sealed, &ws); err != nil || ws.ID == "" {
		return nil, time.Time{}
	}
	sig := &sessionstore.Signal{
		ID: ws.ID, Seq: *p.Seq, To: k, Payload: ws.Payload,
		FromSession: ws.From, Kind: ws.Kind, CreatedAt: ws.CreatedAt.UTC(), IdempotencyKey: ws.IdempotencyKey,
		Delivery: marconi.Delivery(ws.Delivery), RouteState: marconi.RouteState(ws.RouteState),
	}
	return sig, ws.RegisteredAt.UTC()
}

// decode parses a NOTIFY payload of either form: one object (as every
// instance sends one wake-up) or an array of 1 to MaxWakeBatch such objects
// of at most MaxWakeBatchPayload bytes in all. It is as strict as
// DecodeWake: one malformed entry refuses the whole payload. A carried
// signal is kept only when its MAC checks out under one of the codec's keys.
func (c wakeCodec) decode(payload string) ([]Wake, error) {
	wakes, _, err := c.decodeTally(payload)
	return wakes, err
}

// decodeTally is decode, and what it opened.
func (c wakeCodec) decodeTally(payload string) ([]Wake, openTally, error) {
	var t openTally
	if w, ok := c.openSealed(&t, payload); ok {
		return []Wake{w}, t, nil
	}
	t = openTally{} // the general way opens it again
	wakes, err := c.decodeJSON(&t, payload)
	return wakes, t, err
}

// decodeJSON is decode's general way, with encoding/json.
func (c wakeCodec) decodeJSON(t *openTally, payload string) ([]Wake, error) {
	var ps []wakePayload
	if !strings.HasPrefix(strings.TrimLeft(payload, jsonSpace), "[") {
		if len(payload) > MaxWakePayload {
			return nil, fmt.Errorf("wake-up payload of %d bytes is over %d", len(payload), MaxWakePayload)
		}
		dec := json.NewDecoder(strings.NewReader(payload))
		var p wakePayload
		if err := dec.Decode(&p); err != nil {
			return nil, fmt.Errorf("malformed wake-up: %w", err)
		}
		if !onlySpace(payload[dec.InputOffset():]) {
			return nil, errors.New("malformed wake-up: data after the object")
		}
		ps = []wakePayload{p}
	} else {
		if len(payload) > MaxWakeBatchPayload {
			return nil, fmt.Errorf("wake-up payload of %d bytes is over %d", len(payload), MaxWakeBatchPayload)
		}
		dec := json.NewDecoder(strings.NewReader(payload))
		if err := dec.Decode(&ps); err != nil {
			return nil, fmt.Errorf("malformed wake-ups: %w", err)
		}
		if !onlySpace(payload[dec.InputOffset():]) {
			return nil, errors.New("malformed wake-ups: data after the array")
		}
		if len(ps) == 0 || len(ps) > MaxWakeBatch {
			return nil, fmt.Errorf("wake-up array of %d entries, want 1 to %d", len(ps), MaxWakeBatch)
		}
	}
	wakes := make([]Wake, len(ps))
	for i, p := range ps {
		if err := p.validate(); err != nil {
			if len(ps) == 1 {
				return nil, err
			}
			return nil, fmt.Errorf("wake-up %d: %w", i, err)
		}
		wakes[i] = Wake{Key: sessionstore.Key{TenantID: p.Tenant, ProjectID: p.Project, SessionID: p.Session}, Seq: *p.Seq}
		wakes[i].Signal, wakes[i].Incarnation = c.carried(t, p)
	}
	return wakes, nil
}

// openSealed decodes payload without reflection when it is one object
// exactly as entry writes a sealed wake-up, with ids and strings of
// printable ASCII that JSON writes unescaped, and its tag checks out over
// the sealed bytes as received under one of the codec's keys (counted in
// t); then it returns what decode's general way would
// (wakecodec_internal_test.go holds the two to that), and ok. Else ok is
// false and decode takes the general way, which also judges a payload that
// is forged or malformed.
func (c wakeCodec) openSealed(t *openTally, payload string) (w Wake, ok bool) {
	const tagLen = len(`,"tag":"`) + 44 + len(`"}`) // a sha256.Size tag in base64
	if c.key == nil || len(payload) > MaxWakePayload {
		return Wake{}, false
	}
	b := []byte(payload) // the signal's payload is a slice of it
	r := plainScan{b}
	var seq []byte
	if !r.lit(`{"tenant":"`) || !r.plain(&w.Key.TenantID) || !r.lit(`,"project":"`) || !r.plain(&w.Key.ProjectID) ||
		!r.lit(`,"session":"`) || !r.plain(&w.Key.SessionID) || !r.lit(`,"seq":`) || !r.digits(&seq) || !r.lit(`,"sealed":`) {
		return Wake{}, false
	}
	var err error
	if w.Seq, err = strconv.ParseInt(string(seq), 10, 64); err != nil || validateWake(w.Key, w.Seq) != nil {
		return Wake{}, false
	}
	rest := r.b
	if len(rest) < tagLen {
		return Wake{}, false
	}
	sealed, tail := rest[:len(rest)-tagLen], rest[len(rest)-tagLen:]
	var tag [sha256.Size + 1]byte
	if !bytes.HasPrefix(tail, []byte(`,"tag":"`)) || !bytes.HasSuffix(tail, []byte(`"}`)) {
		return Wake{}, false
	}
	if n, err := strictBase64.Decode(tag[:], tail[len(`,"tag":"`):len(tail)-2]); err != nil || n != sha256.Size ||
		!c.open(t, w.Key, w.Seq, sealed, tag[:n]) {
		return Wake{}, false
	}
	// The tag checks out: decode what it covers.
	sig := &sessionstore.Signal{Seq: w.Seq, To: w.Key}
	var delivery, route string
	r = plainScan{sealed}
	if !r.lit(`{"registered_at":"`) || !r.time(&w.Incarnation) || !r.lit(`,"id":"`) || !r.plain(&sig.ID) ||
		!r.lit(`,"from":"`) || !r.plain(&sig.FromSession) || !r.lit(`,"kind":"`) || !r.plain(&sig.Kind) {
		return Wake{}, false
	}
	if r.lit(`,"payload":`) {
		// Every string after the payload is plain, so the last
		// `,"created_at":"` ends it.
		i := bytes.LastIndex(r.b, []byte(`,"created_at":"`))
		if i < 0 || !json.Valid(r.b[:i]) {
			return Wake{}, false
		}
		sig.Payload, r.b = json.RawMessage(r.b[:i:i]), r.b[i:]
	}
	if !r.lit(`,"created_at":"`) || !r.time(&sig.CreatedAt) ||
		(r.lit(`,"idempotency_key":"`) && (!r.plain(&sig.IdempotencyKey) || sig.IdempotencyKey == "")) ||
		!r.lit(`,"delivery":"`) || !r.plain(&delivery) || !r.lit(`,"route_state":"`) || !r.plain(&route) ||
		!r.lit(`}`) || len(r.b) != 0 || sig.ID == "" {
		return Wake{}, false
	}
	sig.Delivery, sig.RouteState = marconi.Delivery(delivery), marconi.RouteState(route)
	w.Signal = sig
	return w, true
}

// plainScan reads the JSON that openSealed decodes, from the front of b.
type plainScan struct{ b []byte }

// lit consumes l when b starts with it.
func (r *plainScan) lit(l string) bool {
	if !bytes.HasPrefix(r.b, []byte(l)) {
		return false
	}
	r.b = r.b[len(l):]
	return true
}

// plain consumes a string's rest and its closing quote into *s when every
// byte before that is printable ASCII other than a backslash: the bytes of
// the string JSON decodes it to.
func (r *plainScan) plain(s *string) bool {
	for i, c := range r.b {
		if c == '"' {
			*s, r.b = string(r.b[:i]), r.b[i+1:]
			return true
		}
		if c < 0x20 || c > 0x7e || c == '\\' {
			return false
		}
	}
	return false
}

// digits consumes a JSON number that is a non-negative integer into *d.
func (r *plainScan) digits(d *[]byte) bool {
	n := 0
	for n < len(r.b) && r.b[n] >= '0' && r.b[n] <= '9' {
		n++
	}
	if n == 0 || (n > 1 && r.b[0] == '0') {
		return false
	}
	*d, r.b = r.b[:n], r.b[n:]
	return true
}

// time consumes a string's rest into *t, as time.Time's UnmarshalJSON
// reads it, in UTC.
func (r *plainScan) time(t *time.Time) bool {
	i := bytes.IndexByte(r.b, '"')
	if i < 0 {
		return false
	}
	var v time.Time
	if err := v.UnmarshalText(r.b[:i]); err != nil {
		return false
	}
	*t, r.b = v.UTC(), r.b[i+1:]
	return true
}

// jsonSpace is JSON's whitespace.
const jsonSpace = " \t\r\n"

// onlySpace reports whether s is JSON whitespace only. (A json.Decoder's
// More is false at a stray "]" or "}", so it cannot tell.)
func onlySpace(s string) bool { return strings.Trim(s, jsonSpace) == "" }

func (p wakePayload) validate() error {
	if p.Seq == nil {
		return errors.New("wake-up has no seq")
	}
	return validateWake(sessionstore.Key{TenantID: p.Tenant, ProjectID: p.Project, SessionID: p.Session}, *p.Seq)
}

// validateWake refuses a wake-up that names no session, or one with an id
// over maxWakeField bytes, or a negative seq.
func validateWake(k sessionstore.Key, seq int64) error {
	for _, f := range [...]struct{ name, v string }{{"tenant", k.TenantID}, {"project", k.ProjectID}, {"session", k.SessionID}} {
		if f.v == "" || len(f.v) > maxWakeField {
			return fmt.Errorf("wake-up %s must have 1 to %d bytes", f.name, maxWakeField)
		}
	}
	if seq < 0 { // 0 is a check wake-up (fabric.CheckSeq)
		return fmt.Errorf("wake-up seq %d is negative", seq)
	}
	return nil
}

// Bus is the Postgres wake-up bus (fabric.Bus) of a Store. Publish sends
// NOTIFY on a pooled connection of its own, after the signal's append
// committed and outside any append's transaction, batched: concurrent
// publishers share one statement of at most the store's WithMaxBatch
// wake-ups, and eight times as many wait for one (Postgres serialises
// notifying commits on one global lock, so fewer is faster). Listen holds two dedicated
// connections of its own. It is safe for concurrent use.
type Bus struct {
	store    *Store
	log      *slog.Logger
	notifier *committer
}

// NewBus returns the wake-up bus of s. A nil log discards.
func NewBus(s *Store, log *slog.Logger) *Bus {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := &Bus{store: s, log: log}
	b.notifier = newCommitter(s.maxBatch, 8*s.maxBatch, 1, b.runWakes)
	return b
}

// keyRetry spaces the reads of a bus key that could not be read (the
// schema not yet migrated, the store unreachable): meanwhile wake-ups go
// bare, or keep the keys read before.
const keyRetry = 5 * time.Second

// keyReadTimeout bounds reading the bus key, so that the listener, which
// reads it on its first wake-up, never waits long for a pooled connection.
const keyReadTimeout = 2 * time.Second

// Publish sends w to instance's channel, with the next batch of wake-ups
// (notifySQL), and returns once that NOTIFY is sent. w carries its signal
// when it fits a payload and the bus key is known. Returns an error wrapping
// sessionstore.ErrUnavailable when Postgres cannot be reached.
func (b *Bus) Publish(ctx context.Context, instance string, w sessionstore.Wake) error {
	if _, err := (wakeCodec{}).entry(w); err != nil {
		return err
	}
	if b.store.closed.Load() {
		return wrap("publish wake-up", fmt.Errorf("store closed: %w", sessionstore.ErrUnavailable))
	}
	r := &appendReq{wake: &wakeReq{instance: instance, w: w}}
	if err := b.notifier.do(ctx, r); err != nil {
		return wrap("publish wake-up", fmt.Errorf("%w: %w", sessionstore.ErrUnavailable, err))
	}
	return wrap("publish wake-up", r.out.err)
}

// runWakes sends batch's wake-ups in one statement, a transaction of its
// own that does not wait for its commit to be flushed (a wake-up is a hint:
// one lost in a crash is the sweep's), and sets each one's outcome.
func (b *Bus) runWakes(_ int, batch []*appendReq) {
	ctx, cancel, err := b.store.call(context.Background())
	defer cancel()
	if err == nil {
		instances, payloads := batchWakes(batch, b.codec(ctx))
		_, err = b.store.pool.Exec(ctx, notifySQL, instances, payloads)
	}
	for _, r := range batch {
		r.out = appendOutcome{err: err}
	}
}

// notifySQL sends the NOTIFYs of a batch (batchWakes: one per instance
// unless its wake-ups overflow one payload).
const notifySQL = `SELECT set_config('synchronous_commit', 'off', true),
	(SELECT count(pg_notify(` + "'marconi_wake_' || md5(coalesce(current_schema(), '') || '/' || i), p)" + `)
	 FROM unnest($1::text[], $2::text[]) AS x(i, p))`

// codec is the wake-up codec of the bus keys this store knows now (the
// store's keyring reads them again when they are due).
func (b *Bus) codec(ctx context.Context) wakeCodec {
	return b.store.busKeys.get(ctx, b.store, b.log).codec()
}

// SealWakes encodes wakes as EncodeWakes does, each carrying its signal
// sealed under the newest bus key this store knows, for a bus other than
// NOTIFY (fabric/natsbus) to carry: the same payloads, the same MAC.
func (b *Bus) SealWakes(ctx context.Context, wakes []Wake) ([]string, error) {
	return b.codec(ctx).encode(wakes)
}

// OpenWakes decodes a payload as DecodeWakes does, keeping a carried signal
// only when its MAC checks out under the current bus key or, within its
// grace, the previous one: the other half of SealWakes. A carried signal
// that neither opens arrives bare (the holder reads the signal from the
// store), and has the key read again in the background (at most once per
// BusKeyTimings.Recheck; keyring.recheckSoon), since its sender may know a
// rotation this store has not read yet: the wake-ups after it open with
// what that read finds, and none waits for it.
func (b *Bus) OpenWakes(ctx context.Context, payload string) ([]Wake, error) {
	wakes, t, err := b.codec(ctx).decodeTally(payload)
	if err == nil && t.missed > 0 {
		b.store.busKeys.recheckSoon(b.store, b.log)
	}
	b.store.busKeys.metrics.count(t)
	return wakes, err
}

// Channel is the NOTIFY channel that instance listens on, in this store's
// schema; for operators (pg_stat_activity, psql) and tests.
func (b *Bus) Channel(ctx context.Context, instance string) (string, error) {
	ctx, cancel, err := b.store.call(ctx)
	defer cancel()
	if err != nil {
		return "", wrap("wake-up channel", err)
	}
	var ch string
	err = b.store.pool.QueryRow(ctx, `SELECT `+channelSQL, instance).Scan(&ch)
	return ch, wrap("wake-up channel", err)
}

// livenessLocks are the liveness locks a connection holds, or is to hold:
// the instance's, exclusively (one process per instance id), and its
// process's, shared (what ConnectedInstances reads). Both of a process's
// dedicated connections hold the process's, so that it stays held while
// either one is replaced.
type livenessLocks struct{ instance, process bool }

// covers reports whether l holds every lock of want.
func (l livenessLocks) covers(want livenessLocks) bool {
	return (l.instance || !want.instance) && (l.process || !want.process)
}

// lockLiveness takes, on conn and without waiting, whichever lock of want
// conn does not hold yet (held): the instance's exclusively
// (livenessKeySQL), that of its process started at startedAt shared
// (processKeySQL). The instance's may be held by another connection: a
// process of the same id (killed, whose backend has not ended yet, or,
// misconfigured, alive), or this process's own earlier liveness connection
// that Postgres has not seen end. The process's is refused only while a
// session holds it exclusively, which no process of this version does. The
// caller tries again.
func (b *Bus) lockLiveness(ctx context.Context, conn *pgx.Conn, instance string, startedAt time.Time, want, held livenessLocks) (livenessLocks, error) {
	var got livenessLocks
	err := conn.QueryRow(ctx, `SELECT
		CASE WHEN $3::bool THEN pg_try_advisory_lock(`+livenessKeySQL+`) ELSE false END,
		CASE WHEN $4::bool THEN pg_try_advisory_lock_shared(`+processKeySQL+`) ELSE false END`,
		instance, startedAt, want.instance && !held.instance, want.process && !held.process).Scan(&got.instance, &got.process)
	if err != nil {
		return held, fmt.Errorf("liveness lock: %w", err)
	}
	held = livenessLocks{instance: held.instance || got.instance, process: held.process || got.process}
	if want.instance && !held.instance {
		b.log.Warn("another connection holds this instance's liveness lock; retrying (this process's earlier liveness connection not yet gone, a killed process of the same instance id not yet gone, or two processes share MARCONI_INSTANCE_ID)",
			"instance", instance)
	}
	if want.process && !held.process {
		b.log.Warn("another connection holds this process's liveness lock exclusively; retrying",
			"instance", instance)
	}
	return held, nil
}

// ConnectedInstances returns, for each instance in the instance table whose
// current process (the row's started_at) has a connection alive now that
// holds the process's liveness lock (Listen's two take it, shared; an
// older version's listener, exclusively: any granted lock counts), that
// process's started_at. A process killed in any way loses it as soon as
// Postgres sees its connections end; the heartbeat remains the judge of
// hangs and partitions. A process restarted with the same id is not
// reported until its own connections hold its own lock, whatever the
// backend of the process before it still holds. server names the Postgres server
// that answered (its postmaster's start time): locks live in one server's
// memory, so after a failover or a restart none is held until each process
// takes its lock again there. Returns an error wrapping
// sessionstore.ErrUnavailable when Postgres cannot be reached.
func (b *Bus) ConnectedInstances(ctx context.Context) (live map[string]time.Time, server string, err error) {
	ctx, cancel, err := b.store.call(ctx)
	defer cancel()
	if err != nil {
		return nil, "", wrap("connected instances", err)
	}
	key := strings.NewReplacer("$1::text", "id", "$2::timestamptz", "started_at").Replace(processKeySQL)
	var ids []string
	var started []time.Time
	err = b.store.pool.QueryRow(ctx, `
		WITH k AS (SELECT id, started_at, `+key+` AS key FROM instances),
		held AS (SELECT k.id, k.started_at FROM k WHERE EXISTS (
			SELECT 1 FROM pg_locks l
			WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
			  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND l.classid::bigint = (k.key >> 32) & 4294967295
			  AND l.objid::bigint = k.key & 4294967295))
		SELECT pg_postmaster_start_time()::text,
			coalesce((SELECT array_agg(id ORDER BY id) FROM held), '{}'),
			coalesce((SELECT array_agg(started_at ORDER BY id) FROM held), '{}')`).Scan(&server, &ids, &started)
	if err != nil {
		return nil, "", wrap("connected instances", err)
	}
	if len(ids) != len(started) {
		return nil, "", fmt.Errorf("connected instances: %d ids, %d start times", len(ids), len(started))
	}
	live = make(map[string]time.Time, len(ids))
	for i, id := range ids {
		live[id] = started[i].UTC()
	}
	return live, server, nil
}

// Listen listens on instance's channel on a dedicated connection and hands
// every well-formed wake-up to onWake, until ctx ends; then it closes its
// connections and returns nil. Beside the listener's connection it keeps a
// second one, the liveness connection: it holds the instance's liveness
// lock, and both hold, shared, the lock of instance's process started at
// startedAt, this process's StartedAt as its heartbeats write it
// (ConnectedInstances), so that losing either connection while the process
// lives is no death to the peers. A dropped connection is replaced with
// exponential backoff (and full jitter); onConnect runs each time LISTEN is
// in place, because wake-ups sent meanwhile are lost. The listener's
// connects are counted in marconi_pg_listener_connects_total, the liveness
// connection's in marconi_liveness_connects_total.
// onWake and onConnect run on Listen's goroutine and must not block for
// long.
func (b *Bus) Listen(ctx context.Context, instance string, startedAt time.Time, onWake func(sessionstore.Wake), onConnect func()) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		b.keep(ctx, livenessConn, instance, startedAt, func(sessionstore.Wake) {}, b.store.connects.liveness.Inc)
	}()
	b.keep(ctx, listenerConn, instance, startedAt, onWake, func() { b.store.connects.listener.Inc(); onConnect() })
	return nil
}

// dedicatedConn is one of the two connections Listen keeps open.
type dedicatedConn struct {
	app       string        // its application_name
	idleCheck time.Duration // how long it idles before it checks itself
	locks     livenessLocks // the liveness locks it holds
	listen    bool          // whether it LISTENs on the instance's channel
	// What it logs when it lost its connection, and when it cannot open one.
	lost, cannotConnect string
}

var (
	// listenerConn hears the wake-ups.
	listenerConn = dedicatedConn{
		app: ListenerApplicationName, idleCheck: listenIdleCheck, locks: livenessLocks{process: true}, listen: true,
		lost:          "wake-up listener lost its connection; reconnecting (signals meanwhile arrive by the pending sweep)",
		cannotConnect: "wake-up listener cannot connect; retrying (signals meanwhile arrive by the pending sweep)",
	}
	// livenessConn only holds locks: while the listener's connection is
	// replaced, it holds the process's.
	livenessConn = dedicatedConn{
		app: LivenessApplicationName, idleCheck: livenessIdleCheck, locks: livenessLocks{instance: true, process: true},
		lost:          "liveness connection lost; reconnecting (meanwhile the wake-up listener's connection, while it lasts, holds the process's liveness lock)",
		cannotConnect: "liveness connection cannot connect; retrying",
	}
)

// keep runs c's connection until ctx ends, replacing it, when it drops or
// cannot be opened, with exponential backoff (and full jitter).
func (b *Bus) keep(ctx context.Context, c dedicatedConn, instance string, startedAt time.Time, onWake func(sessionstore.Wake), onConnect func()) {
	backoff := listenBackoffMin
	for {
		connected, err := b.runConn(ctx, c, instance, startedAt, onWake, onConnect)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = listenBackoffMin
		}
		wait := rand.N(backoff) + time.Millisecond
		if connected {
			b.log.Warn(c.lost, "instance", instance, "retry_in", wait, "err", err)
		} else {
			// It never had a connection: say so, and why.
			b.log.Warn(c.cannotConnect, "instance", instance, "retry_in", wait, "cause", Diagnose(err))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, listenBackoffMax)
	}
}

// runConn runs one connection of c: connect, turn the server's timeouts
// off for its session (dedicatedSessionSQL), take its liveness locks,
// LISTEN when c listens, onConnect, then wait for notifications until the
// connection fails or ctx ends. connected reports whether it got that far.
// A connection that does not listen waits all the same: that is how it
// notices at once that its backend ended.
func (b *Bus) runConn(ctx context.Context, c dedicatedConn, instance string, startedAt time.Time, onWake func(sessionstore.Wake), onConnect func()) (connected bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, listenCallTimeout)
	defer cancel()
	cfg := b.store.pool.Config().ConnConfig // a copy
	cfg.RuntimeParams["application_name"] = c.app
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	if _, err := conn.Exec(cctx, dedicatedSessionSQL); err != nil {
		return false, fmt.Errorf("session settings: %w", err)
	}
	locks, err := b.lockLiveness(cctx, conn, instance, startedAt, c.locks, livenessLocks{})
	if err != nil {
		return false, err
	}
	var channel string
	if c.listen {
		if err := conn.QueryRow(cctx, `SELECT `+channelSQL, instance).Scan(&channel); err != nil {
			return false, fmt.Errorf("channel name: %w", err)
		}
		if _, err := conn.Exec(cctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return false, fmt.Errorf("listen: %w", err)
		}
		b.log.Debug("wake-up listener listening", "instance", instance, "channel", channel)
	}
	onConnect()
	for {
		wait := c.idleCheck
		if !locks.covers(c.locks) {
			wait = livenessRetry
		}
		// Read the bus key when it is due, and wake when it is due next,
		// so that an idle instance too seals with a rotated key within its
		// refresh.
		b.codec(ctx)
		wait = min(wait, max(b.store.busKeys.due(), time.Millisecond))
		wctx, cancel := context.WithTimeout(ctx, wait)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			wakes, derr := b.OpenWakes(ctx, n.Payload)
			if derr != nil {
				b.log.Warn("ignoring a malformed wake-up", "channel", channel, "err", derr)
				continue
			}
			for _, w := range wakes {
				onWake(w)
			}
		case ctx.Err() != nil:
			return true, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) && !locks.covers(c.locks):
			pctx, cancel := context.WithTimeout(ctx, listenCallTimeout)
			locks, err = b.lockLiveness(pctx, conn, instance, startedAt, c.locks, locks)
			cancel()
			if err != nil {
				return true, err
			}
		case errors.Is(err, context.DeadlineExceeded):
			// Quiet for a while: make sure the connection still works.
			pctx, cancel := context.WithTimeout(ctx, listenCallTimeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return true, fmt.Errorf("idle check: %w", err)
			}
		default:
			return true, fmt.Errorf("wait for notification: %w", err)
		}
	}
}
