package conns

import (
	"encoding/base64"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/marconihub/marconi"
)

// CheckHandshake reports whether r is a WebSocket opening handshake that
// the upgrade will accept (RFC 6455 §4.2.1, as coder/websocket checks it),
// so that a request that is none is refused before any work or state change.
// It answers 426 upgrade_required for a request that asks no upgrade, and
// 400 invalid_field for a malformed handshake. It sets on hdr (the response
// headers) what the RFC asks a refusal to carry.
func CheckHandshake(r *http.Request, hdr http.Header) error {
	if !r.ProtoAtLeast(1, 1) || !headerHasToken(r.Header, "Connection", "upgrade") || !headerHasToken(r.Header, "Upgrade", "websocket") {
		hdr.Set("Connection", "Upgrade")
		hdr.Set("Upgrade", "websocket")
		return marconi.Errorf(marconi.CodeUpgradeRequired, "GET /v1/ws is a WebSocket endpoint: send an HTTP/1.1 upgrade (Connection: Upgrade, Upgrade: websocket)")
	}
	if r.Header.Get("Sec-WebSocket-Version") != "13" {
		hdr.Set("Sec-WebSocket-Version", "13")
		return marconi.Errorf(marconi.CodeInvalidField, "Sec-WebSocket-Version must be 13")
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return marconi.Errorf(marconi.CodeInvalidField, "the handshake needs exactly one Sec-WebSocket-Key")
	}
	if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(k) != 16 {
		return marconi.Errorf(marconi.CodeInvalidField, "Sec-WebSocket-Key must be 16 bytes in base64")
	}
	return nil
}

// headerHasToken reports whether a comma-separated header key of h holds
// token, case-insensitively.
func headerHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// connRetryAfter is what a connection refused by a cap is told to wait.
const connRetryAfter = 5 * time.Second

// admission counts open connections, in all and per client address, against
// their caps. It is safe for concurrent use.
type admission struct {
	max, maxPerAddr int

	mu     sync.Mutex
	total  int
	byAddr map[string]int
}

func newAdmission(max, maxPerAddr int) *admission {
	return &admission{max: max, maxPerAddr: maxPerAddr, byAddr: make(map[string]int)}
}

// admit takes a slot for addr, or refuses with quota_exceeded.
func (a *admission) admit(addr string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.total >= a.max {
		return marconi.QuotaExceeded(marconi.QuotaConnectionsTotal, connRetryAfter, "this instance holds its maximum of %d WebSocket connections; retry later or elsewhere", a.max)
	}
	if a.byAddr[addr] >= a.maxPerAddr {
		return marconi.QuotaExceeded(marconi.QuotaConnectionsPerAddress, connRetryAfter, "%d WebSocket connections are open from this address, the most allowed", a.maxPerAddr)
	}
	a.total++
	a.byAddr[addr]++
	return nil
}

// release gives back a slot of addr.
func (a *admission) release(addr string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.total--
	if n := a.byAddr[addr] - 1; n > 0 {
		a.byAddr[addr] = n
	} else {
		delete(a.byAddr, addr)
	}
}

// Admit checks r's WebSocket handshake (CheckHandshake) and takes a
// connection slot for its client address (the TCP peer: behind a load
// balancer, the balancer's), refusing with 429 quota_exceeded past
// MaxConnections or MaxConnectionsPerAddress. It changes nothing else, so
// the caller calls it before any other work. The slot is held until release
// is called, once the request's handler is done.
func (h *Hub) Admit(r *http.Request, hdr http.Header) (release func(), err error) {
	if err := CheckHandshake(r, hdr); err != nil {
		return nil, err
	}
	addr, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		addr = r.RemoteAddr
	}
	if err := h.admission.admit(addr); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { h.admission.release(addr) }) }, nil
}
