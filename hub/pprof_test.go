package hub_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
)

// getRaw returns the status and body of a GET carrying cred, if any.
func getRaw(t *testing.T, url, cred string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestPprofOnlyWhenOnAndOnlyToTheAdmin: the runtime profiles are served
// with MARCONI_PPROF on, to the admin token only; off (the default) they are
// not served at all.
func TestPprofOnlyWhenOnAndOnlyToTheAdmin(t *testing.T) {
	const goroutines = "/debug/pprof/goroutine?debug=1"
	off := hubtest.Start(t, hubtest.Options{})
	if st, body := getRaw(t, off.URL+goroutines, off.AdminToken); strings.Contains(body, "goroutine profile:") {
		t.Fatalf("pprof off: %d, served a goroutine profile", st)
	}

	on := hubtest.Start(t, hubtest.Options{Config: hub.Config{Pprof: true}})
	for _, cred := range []string{"", on.APIKey, "madm_not-the-admin-token"} {
		if st, body := getRaw(t, on.URL+goroutines, cred); st != http.StatusUnauthorized || strings.Contains(body, "goroutine profile:") {
			t.Errorf("pprof on, credential %q: %d %.80q; want 401 and no profile", cred, st, body)
		}
	}
	if st, body := getRaw(t, on.URL+goroutines, on.AdminToken); st != http.StatusOK || !strings.Contains(body, "goroutine profile:") {
		t.Errorf("pprof on, admin token: %d %.80q; want the goroutine profile", st, body)
	}
	if st, body := getRaw(t, on.URL+"/debug/pprof/", on.AdminToken); st != http.StatusOK || !strings.Contains(body, "heap") {
		t.Errorf("pprof index: %d %.80q; want the list of profiles", st, body)
	}
	if st, body := getRaw(t, on.URL+"/debug/pprof/cmdline", on.AdminToken); st != http.StatusOK || body == "" {
		t.Errorf("pprof cmdline: %d %.80q", st, body)
	}
}
