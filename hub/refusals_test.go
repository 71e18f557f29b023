package hub_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// rawExchange writes req as it is to the hub and reads the one answer.
func rawExchange(t *testing.T, h *hubtest.Hub, req string) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	go io.WriteString(conn, req) // the hub may answer before it has read it all
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no HTTP answer to %.80q: %v", req, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer to %.80q: %v", req, err)
	}
	return resp, body
}

// wantErrorShape fails unless body is the one error shape with a code
// whose status (the contract's table) is status.
func wantErrorShape(t *testing.T, what string, resp *http.Response, body []byte) string {
	t.Helper()
	var e struct {
		Error *struct{ Code, Message string } `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("%s: %d %s %q is not the error shape", what, resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if want, ok := statusOfCode[e.Error.Code]; !ok || want != resp.StatusCode {
		t.Fatalf("%s: %d with code %q: not a documented pair", what, resp.StatusCode, e.Error.Code)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s: Content-Type %q, want application/json", what, ct)
	}
	return e.Error.Code
}

// TestNetHTTPRefusalsInErrorShape (issue 19, "also seen"): what net/http
// refuses before the hub's handler runs is answered in the error shape.
func TestNetHTTPRefusalsInErrorShape(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	for _, c := range []struct {
		name, req string
		status    int
		code      string
	}{
		{"headers past MARCONI_MAX_HEADER_BYTES", "GET /healthz HTTP/1.1\r\nHost: hub\r\nX-Big: " + strings.Repeat("a", 64<<10) + "\r\n\r\n", 431, "headers_too_large"},
		{"a control byte in a header name", "GET /healthz HTTP/1.1\r\nHost: hub\r\nX-B\x01d: 1\r\n\r\n", 400, "bad_request"},
		{"a NUL in a header value", "GET /healthz HTTP/1.1\r\nHost: hub\r\nX-Bad: a\x00b\r\n\r\n", 400, "bad_request"},
		{"two Content-Length that differ", "POST /v1/signals HTTP/1.1\r\nHost: hub\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}", 400, "bad_request"},
		{"no Host header", "GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request"},
		{"a transfer coding net/http does not know", "POST /v1/signals HTTP/1.1\r\nHost: hub\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "not_implemented"},
		{"a protocol version net/http does not speak (found by FuzzRawRequest)", "GET /healthz HTTP/0.0\r\nHost: hub\r\n\r\n", 505, "http_version_not_supported"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body := rawExchange(t, h, c.req)
			if resp.StatusCode != c.status {
				t.Fatalf("%d %q, want %d", resp.StatusCode, body, c.status)
			}
			if code := wantErrorShape(t, c.name, resp, body); code != c.code {
				t.Fatalf("code %q, want %q", code, c.code)
			}
		})
	}
	// An ordinary answer passes untouched.
	if resp, body := rawExchange(t, h, "GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n"); resp.StatusCode != 200 || !strings.Contains(string(body), `"ok"`) {
		t.Fatalf("healthz: %d %q", resp.StatusCode, body)
	}
}

// FuzzRawRequest writes hostile request heads (the request line and headers
// as bytes on the wire, then a body) to a real hub: whatever refuses them,
// net/http or the hub, every answer is HTTP, never a 5xx but net/http's 501
// and 505, and every error of the API (a /v1/ path) or of net/http itself
// (400, 431, 501, 505) is in
// the error shape with a documented code and status. Seeds:
// the f.Add calls below.
func FuzzRawRequest(f *testing.F) {
	// A head that promises a body it does not send waits for the bound.
	h := hubtest.Start(f, hubtest.Options{Config: hub.Config{BodyReadTimeout: 100 * time.Millisecond}})
	f.Add("POST /v1/signals HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer mst_x\r\nContent-Length: 100\r\n", "{")
	f.Add("GET /healthz HTTP/1.1\r\nHost: hub\r\nX-\x7f: 1\r\n", "")
	f.Add("POST /v1/sessions HTTP/1.1\r\nHost: hub\r\nContent-Length: 3\r\nContent-Length: 4\r\n", "{}")
	f.Add("POST /v1/ops/api_keys HTTP/1.1\r\nHost: hub\r\nTransfer-Encoding: chunked, gzip\r\n", "")
	f.Fuzz(func(t *testing.T, head, body string) {
		if len(head) > 8<<10 || strings.Contains(head, "\r\n\r\n") {
			t.Skip("one head per request, under the header bound")
		}
		resp, got := rawExchange(t, h, head+"Connection: close\r\n\r\n"+body)
		if resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented && resp.StatusCode != http.StatusHTTPVersionNotSupported {
			t.Fatalf("%q: %d %q", head, resp.StatusCode, got)
		}
		line, _, _ := strings.Cut(head, "\r\n")
		fields := strings.Fields(line)
		api := len(fields) > 1 && strings.HasPrefix(fields[1], "/v1/")
		netHTTP := resp.StatusCode == 400 || resp.StatusCode == 431 || resp.StatusCode == 501 || resp.StatusCode == 505
		if resp.StatusCode >= 400 && (api || netHTTP) && (len(fields) == 0 || fields[0] != "HEAD") {
			wantErrorShape(t, head, resp, got)
		}
	})
}
