package hub_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub/hubtest"
)

func TestDashboardIsServedAtRoot(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	resp, err := http.Get(h.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(body), "<html") {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// Unknown API paths stay JSON errors, not the page.
	st, r := call(t, "GET", h.URL+"/v1/nope", "", nil)
	if st != 404 || errCode(r) != "not_found" {
		t.Fatalf("GET /v1/nope: %d %v", st, r)
	}
}

func TestHeadOnPublicPaths(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	for _, p := range []string{"/", "/healthz", "/readyz", "/metrics"} {
		resp, err := http.Head(h.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("HEAD %s: %d, want 200", p, resp.StatusCode)
		}
	}
}
