package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"
)

// Only a failure that certainly never reached a hub is sent elsewhere.
func TestNotProcessed(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	read := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"connection refused", context.Background(), fmt.Errorf("post: %w: %w", errNoAnswer, dial), true},
		{"no such host", context.Background(), &net.DNSError{Err: "no such host", Name: "hub-9"}, true},
		{"connection reset after the request", context.Background(), fmt.Errorf("post: %w: %w", errNoAnswer, read), false},
		{"answer lost", context.Background(), errNoAnswer, false},
		{"balancer 503", context.Background(), &Error{Status: 503, Code: codeUnexpected}, true},
		{"balancer 502", context.Background(), &Error{Status: 502, Code: codeUnexpected}, true},
		{"balancer 504", context.Background(), &Error{Status: 504, Code: codeUnexpected}, false},
		{"hub's own 503", context.Background(), &Error{Status: 503, Code: "draining"}, false},
		{"hub's 500", context.Background(), &Error{Status: 500, Code: "internal"}, false},
		{"canceled dial", canceled, fmt.Errorf("post: %w: %w", errNoAnswer, dial), false},
		{"no error", context.Background(), nil, false},
		{"other", context.Background(), errors.New("x"), false},
	}
	for _, tt := range tests {
		if got := notProcessed(tt.ctx, tt.err); got != tt.want {
			t.Errorf("%s: notProcessed %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A hint is followed only to an http(s) URL that is not the client's own
// hub URL, does not take the token from https to plain http, and names
// this machine only when the client reaches a hub on it too.
func TestHolderHintUsable(t *testing.T) {
	plain := newHolders(8, time.Minute, []string{"http://lb:8080"})
	tls := newHolders(8, time.Minute, []string{"https://lb"})
	local := newHolders(8, time.Minute, []string{"http://127.0.0.1:8080"})
	tests := []struct {
		h          *holders
		hint, want string
	}{
		{plain, "http://lb:8080/i/hub-2/", "http://lb:8080/i/hub-2"},
		{plain, "http://lb:8080", ""},
		{plain, "http://lb:8080/", ""},
		{plain, "ftp://lb/i/hub-2", ""},
		{plain, "http://user:pw@lb/i/hub-2", ""},
		{plain, "http://lb/i/hub-2?x=1", ""},
		{plain, "/i/hub-2", ""},
		{plain, "", ""},
		{tls, "https://lb/i/hub-2", "https://lb/i/hub-2"},
		{tls, "http://lb/i/hub-2", ""},
		// An instance's default public URL, seen from another machine.
		{plain, "http://127.0.0.1:8081", ""},
		{plain, "http://localhost:8081", ""},
		{plain, "http://api.localhost:8081", ""},
		{plain, "http://[::1]:8081", ""},
		{plain, "http://0.0.0.0:8081", ""},
		{plain, "http://127.0.0.2:8081", ""},
		{plain, "http://10.0.0.2:8081", "http://10.0.0.2:8081"},
		// A fleet on the client's own machine.
		{local, "http://127.0.0.1:8081", "http://127.0.0.1:8081"},
		{local, "http://localhost:8081/i/hub-2", "http://localhost:8081/i/hub-2"},
	}
	for _, tt := range tests {
		if got := tt.h.usable(tt.hint); got != tt.want {
			t.Errorf("hubs %v, hint %q: %q, want %q", tt.h.hubs, tt.hint, got, tt.want)
		}
	}
}

// The hints and the unreachable URLs stay within max; an unreachable URL is
// left alone for retryAfter, then tried again.
func TestHoldersBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHolders(4, time.Minute, []string{"http://lb"})
	h.now = func() time.Time { return now }
	for i := range 100 {
		h.learn(fmt.Sprint("r", i), fmt.Sprintf("http://hub-%d", i))
		h.unreachable("x", fmt.Sprintf("http://dead-%d", i))
	}
	if len(h.hints) > 4 || len(h.bad) > 4 {
		t.Fatalf("%d hints, %d unreachable URLs; want at most 4 each", len(h.hints), len(h.bad))
	}
	h.learn("bob", "http://hub-b")
	h.unreachable("bob", "http://hub-b")
	h.learn("bob", "http://hub-b") // the next answer names it again
	if got := h.route("bob"); got != "" {
		t.Fatalf("route to an unreachable holder: %q", got)
	}
	h.learn("bob", "http://hub-b")
	now = now.Add(time.Minute)
	if got := h.route("bob"); got != "http://hub-b" {
		t.Fatalf("route after retryAfter: %q, want http://hub-b", got)
	}
	h.learn("bob", "")
	if got := h.route("bob"); got != "" {
		t.Fatalf("route after an answer without a hint: %q", got)
	}
}
