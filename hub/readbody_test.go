package hub

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
)

// moreThanDeclared is a body that yields more than its request declares,
// which net/http never does: readAtMost must refuse it, not cut it.
type moreThanDeclared struct{ io.Reader }

func (moreThanDeclared) Close() error { return nil }

func TestReadAtMost(t *testing.T) {
	const limit = 8
	for _, tc := range []struct {
		name     string
		body     io.ReadCloser
		declared int64
		want     string
		wantErr  func(error) bool
	}{
		{name: "declared length", body: io.NopCloser(strings.NewReader("{\"a\":1}")), declared: 7, want: "{\"a\":1}"},
		{name: "declared length at the limit", body: io.NopCloser(strings.NewReader("12345678")), declared: 8, want: "12345678"},
		{name: "declared past the limit", body: io.NopCloser(strings.NewReader("123456789")), declared: 9, wantErr: isMaxBytes},
		{name: "shorter than declared", body: io.NopCloser(strings.NewReader("123")), declared: 5,
			wantErr: func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{name: "longer than declared", body: moreThanDeclared{strings.NewReader("1234")}, declared: 3, wantErr: isMaxBytes},
		{name: "undeclared length", body: io.NopCloser(strings.NewReader("1234")), declared: -1, want: "1234"},
		{name: "undeclared past the limit", body: io.NopCloser(strings.NewReader("123456789")), declared: -1, wantErr: isMaxBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/v1/signals", nil)
			req.Body, req.ContentLength = tc.body, tc.declared
			got, err := readAtMost(httptest.NewRecorder(), req, limit)
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("readAtMost = %q, %v; want the error", got, err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("readAtMost = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func isMaxBytes(err error) bool {
	_, ok := errors.AsType[*http.MaxBytesError](err)
	return ok
}

// TestTokenCacheTouchLeavesHandedOutSessionsAlone: get hands out the cached
// session itself; a touch must store a changed copy, never change the one
// a request is holding.
func TestTokenCacheTouchLeavesHandedOutSessionsAlone(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	c := newTokenCache(4, time.Minute)
	var h [32]byte
	h[0] = 1
	c.put(h, &sessionstore.Session{ExpiresAt: now.Add(time.Hour), LastVerbAt: now}, now)
	held, ok := c.get(h, now)
	if !ok {
		t.Fatal("get: not cached")
	}
	c.touched(h, sessionstore.Touch{VerbAt: now.Add(time.Second), ExpiresAt: now.Add(2 * time.Hour)})
	if !held.LastVerbAt.Equal(now) || !held.ExpiresAt.Equal(now.Add(time.Hour)) {
		t.Errorf("the held session changed: last_verb_at %v, expires_at %v", held.LastVerbAt, held.ExpiresAt)
	}
	again, ok := c.get(h, now)
	if !ok || !again.LastVerbAt.Equal(now.Add(time.Second)) || !again.ExpiresAt.Equal(now.Add(2*time.Hour)) {
		t.Errorf("after the touch, get = %+v, %v; want the touched copy", again, ok)
	}
}
