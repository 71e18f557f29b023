package hub_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// dribble sends a request whose body arrives in pieces, pause apart, and
// returns the status and error code of the answer.
func dribble(t *testing.T, h *hubtest.Hub, path, cred, body string, pieces int, pause time.Duration) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, cred, len(body))
	step := (len(body) + pieces - 1) / pieces
	for i := 0; i < len(body); i += step {
		if i > 0 {
			time.Sleep(pause) // the client's pace: a slow link, not a wait for the hub
		}
		if _, err := conn.Write([]byte(body[i:min(i+step, len(body))])); err != nil {
			break // the hub answered early and closed
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	return resp.StatusCode, e.Error.Code
}

// TestSlowBodyIsNotAStoreOutage (issue 12.2): a body that takes longer than
// the store timeout to arrive, but less than the body bound, is served; one
// slower than the body bound gets 408 request_timeout. Neither is a 503, nor
// counts in marconi_registry_errors_total.
func TestSlowBodyIsNotAStoreOutage(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{StoreTimeout: 200 * time.Millisecond, BodyReadTimeout: 3 * time.Second}})
	alice := register(t, h, "alice", "codex")
	register(t, h, "bob", "codex")
	body := `{"to_session":"bob","kind":"slow","payload":{"text":"over a slow link"}}`

	// Six pieces 100 ms apart: the body takes 500 ms, past the 200 ms store timeout.
	if st, code := dribble(t, h, "/v1/signals", alice.Token, body, 6, 100*time.Millisecond); st != 200 {
		t.Fatalf("slow send: %d %s, want 200", st, code)
	}
	if st, code := dribble(t, h, "/v1/sessions", h.APIKey, `{"session_id":"carol","surface":"codex"}`, 4, 100*time.Millisecond); st != 201 {
		t.Fatalf("slow registration: %d %s, want 201", st, code)
	}

	slow := hubtest.Start(t, hubtest.Options{Config: hub.Config{StoreTimeout: 200 * time.Millisecond, BodyReadTimeout: 300 * time.Millisecond}})
	dave := register(t, slow, "dave", "codex")
	register(t, slow, "bob", "codex")
	if st, code := dribble(t, slow, "/v1/signals", dave.Token, body, 4, 250*time.Millisecond); st != http.StatusRequestTimeout || code != "request_timeout" {
		t.Fatalf("body slower than the bound: %d %s, want 408 request_timeout", st, code)
	}
	for _, hh := range []*hubtest.Hub{h, slow} {
		if n := metric(t, hh, "marconi_registry_errors_total"); n != 0 {
			t.Fatalf("marconi_registry_errors_total = %v after slow bodies, want 0", n)
		}
	}
	// The keep-alive connection of a served slow body is usable again: the
	// read deadline was cleared.
	if st, _ := call(t, "POST", slow.URL+"/v1/heartbeat", dave.Token, nil); st != 200 {
		t.Fatalf("heartbeat after: %d", st)
	}
}

// TestStalledBodyIsAnswered408: a client that announces a body and stops
// sending half way gets its 408 request_timeout once the body bound passes,
// and the connection is closed; before, net/http first tried to read the
// rest of the body to reuse the connection, and the answer never came.
func TestStalledBodyIsAnswered408(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{BodyReadTimeout: 200 * time.Millisecond}})
	alice := register(t, h, "alice", "codex")
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Far longer than the bound: only a hub that never answers reaches it.
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	body := `{"to_session":"bob","payload":{"text":"never finished"}}`
	fmt.Fprintf(conn, "POST /v1/signals HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", alice.Token, len(body), body[:10])
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != http.StatusRequestTimeout || e.Error.Code != "request_timeout" || !resp.Close {
		t.Fatalf("stalled body: %d %q, close %v; want 408 request_timeout and the connection closed", resp.StatusCode, e.Error.Code, resp.Close)
	}
}

// TestCredentialBeforeBody (issue 19.5): a request without a valid
// credential costs no body read. Its headers promise a body that never
// comes, and the body bound is far longer than the client waits: it is
// answered in the error shape all the same (401, or 410 for a well-formed
// session token that matches no session), and the connection closed
// (nothing is left to read of it). A valid credential still gets its body
// read.
func TestCredentialBeforeBody(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{Config: hub.Config{BodyReadTimeout: time.Hour}})
	alice := register(t, h, "alice", "codex")
	for _, c := range []struct {
		name, path, cred string
		status           int
		code             string
	}{
		{"session token unknown", "/v1/signals", "mst_nobody", 410, "session_expired"},
		{"session token missing", "/v1/signals/ack", "", 401, "unauthorized"},
		{"session token of the wrong kind", "/v1/heartbeat", h.APIKey, 401, "unauthorized"},
		{"API key unknown", "/v1/sessions", "mak_nobody", 401, "unauthorized"},
		{"API key of the wrong kind", "/v1/sessions", alice.Token, 401, "unauthorized"},
		{"admin token unknown", "/v1/ops/api_keys", "madm_nobody", 401, "unauthorized"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(h.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// Only a hub that waits for the body reaches this.
			conn.SetDeadline(time.Now().Add(20 * time.Second))
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 65536\r\n\r\n{", c.path, c.cred)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("no answer before the body: %v", err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			json.NewDecoder(resp.Body).Decode(&e)
			if resp.StatusCode != c.status || e.Error.Code != c.code || e.Error.Message == "" || !resp.Close {
				t.Fatalf("%d %+v, close %v; want %d %s and the connection closed", resp.StatusCode, e.Error, resp.Close, c.status, c.code)
			}
		})
	}
	if st, code := dribble(t, h, "/v1/signals/ack", alice.Token, `{"up_to_seq":0}`, 2, 10*time.Millisecond); st != 200 {
		t.Fatalf("an authenticated body: %d %s, want 200", st, code)
	}
}
