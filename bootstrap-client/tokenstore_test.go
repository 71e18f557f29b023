package bootstrap_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/hub/hubtest"
)

// TestFileTokenStore: nothing kept reads as the zero token; a save creates the
// directory 0700 and the file 0600, replaces the kept token (and its project)
// whole and leaves no temporary file; an older client's file, without a
// project, loads; one with a tenant or project of another type loads the
// token without them; a file that is not a kept token is an error, not an
// empty token.
func TestFileTokenStore(t *testing.T) {
	ctx := t.Context()
	dir := filepath.Join(t.TempDir(), "state", "agent")
	path := filepath.Join(dir, "token.json")
	s := bootstrap.FileTokenStore(path)

	got, err := s.Load(ctx)
	if err != nil || got != (bootstrap.SessionToken{}) {
		t.Fatalf("Load with no file = %+v, %v; want the zero token and nil", got, err)
	}
	for _, want := range []bootstrap.SessionToken{
		{SessionID: "alice", Token: "t-1"},
		{SessionID: "alice", Token: "t-2", TenantID: "acme", ProjectID: "team-a"},
	} {
		if err := s.Save(ctx, want); err != nil {
			t.Fatalf("Save: %v", err)
		}
		got, err := s.Load(ctx)
		if err != nil || got != want {
			t.Fatalf("Load after Save(%+v) = %+v, %v", want, got, err)
		}
	}
	wantMode(t, dir, 0o700|os.ModeDir)
	wantMode(t, path, 0o600)
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries after two saves, want only the token file", len(entries))
	}

	// A file of an older client, without the project, loads as it is.
	if err := os.WriteFile(path, []byte(`{"session_id":"alice","token":"t-3"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load(ctx); err != nil || got != (bootstrap.SessionToken{SessionID: "alice", Token: "t-3"}) {
		t.Errorf("Load of a file without a project = %+v, %v; want alice's token t-3", got, err)
	}

	// A tenant or project of another JSON type is a routing hint lost, not
	// the token: the id and token load, without either hint, with an error
	// that says so (ErrProjectDropped) and holds no token.
	for _, hintBad := range []string{
		`{"session_id":"alice","token":"t-4","tenant_id":5,"project_id":"team-a"}`,
		`{"session_id":"alice","token":"t-4","tenant_id":"acme","project_id":7}`,
		`{"session_id":"alice","token":"t-4","tenant_id":["acme"],"project_id":{"id":"team-a"}}`,
		`{"session_id":"alice","token":"t-4","tenant_id":true}`,
	} {
		if err := os.WriteFile(path, []byte(hintBad), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := s.Load(ctx)
		if !errors.Is(err, bootstrap.ErrProjectDropped) || got != (bootstrap.SessionToken{SessionID: "alice", Token: "t-4"}) {
			t.Errorf("Load of %s = %+v, %v; want alice's token t-4 without a project, and ErrProjectDropped", hintBad, got, err)
		}
		if err != nil && strings.Contains(err.Error(), "t-4") {
			t.Errorf("Load of %s: the error %q holds the token", hintBad, err)
		}
	}
	// null reads as absent, as encoding/json reads it.
	if err := os.WriteFile(path, []byte(`{"session_id":"alice","token":"t-5","tenant_id":null,"project_id":null}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load(ctx); err != nil || got != (bootstrap.SessionToken{SessionID: "alice", Token: "t-5"}) {
		t.Errorf("Load of a file with null project = %+v, %v; want alice's token t-5", got, err)
	}

	// A session id or a token missing, or not a string, is no token at all.
	for _, bad := range []string{
		"not json",
		`{"session_id":"alice"}`,
		`{"token":"t-6"}`,
		`{"session_id":5,"token":"t-6"}`,
		`{"session_id":"alice","token":6}`,
		`{"session_id":"alice","token":null,"tenant_id":5}`,
	} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := s.Load(ctx)
		if err == nil || errors.Is(err, bootstrap.ErrProjectDropped) || got != (bootstrap.SessionToken{}) {
			t.Errorf("Load of %s = %+v, %v; want the zero token and an error that stops Dial", bad, got, err)
		}
		if err != nil && strings.Contains(err.Error(), "t-6") {
			t.Errorf("Load of %s: the error %q holds the token", bad, err)
		}
	}
}

func wantMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != want {
		t.Errorf("%s has mode %v, want %v", path, fi.Mode(), want)
	}
}

// TestTokenStoreResumesARestartedAgent: an agent that keeps its token in a
// file and stops without deregistering (a restart) starts again under its
// name: Dial resumes the live session with the kept token instead of being
// refused, the new token is kept, and what was sent meanwhile is delivered.
// The same start without the kept token is refused 403 (the session is live).
func TestTokenStoreResumesARestartedAgent(t *testing.T) {
	h := hubtest.Start(t, hubtest.Options{})
	path := filepath.Join(t.TempDir(), "kept", "token.json")
	store := bootstrap.FileTokenStore(path)
	sender := dial(t, h.URL, h.APIKey, "kept-sender", nil)

	first := dialConfig(t, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "kept-agent", TokenStore: store})
	kept1, err := store.Load(t.Context())
	if err != nil || kept1.SessionID != "kept-agent" || kept1.Token == "" {
		t.Fatalf("kept after the first Dial: %+v, %v; want kept-agent's token", kept1, err)
	}
	_ = first.Close() // the process ends; the session stays live until its TTL
	sendN(t, sender, "kept-agent", 1, 2)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err = bootstrap.Dial(ctx, bootstrap.Config{HubURL: h.URL, APIKey: h.APIKey, SessionID: "kept-agent", Surface: "claude_code"})
	wantHubError(t, err, 403, "forbidden")

	var in inbox
	resets := 0
	second := dialConfig(t, bootstrap.Config{
		HubURL: h.URL, APIKey: h.APIKey, SessionID: "kept-agent", TokenStore: store,
		OnSignal: in.on, OnAffinityReset: func() { resets++ },
	})
	waitFor(t, "the restarted agent to get what was sent meanwhile", func() bool { return in.len() == 2 })
	wantPayloads(t, "restarted agent", &in, 2)
	kept2, err := store.Load(t.Context())
	if err != nil || kept2.SessionID != "kept-agent" || kept2.Token == "" || kept2.Token == kept1.Token {
		t.Fatalf("kept after the resume: %+v, %v; want a new token (a resume rotates it)", kept2, err)
	}
	if st := second.Stats(); st.Reregistrations != 0 || st.Takeovers != 0 || resets != 0 {
		t.Errorf("resume: stats %+v, %d affinity resets; want a plain resume", st, resets)
	}
	_ = second.Close()
}

// wantHubError fails unless err carries the hub's answer status/code.
func wantHubError(t *testing.T, err error, status int, code string) {
	t.Helper()
	var he *bootstrap.Error
	if !errors.As(err, &he) || he.Status != status || string(he.Code) != code {
		t.Fatalf("err = %v, want the hub's %d %s", err, status, code)
	}
}
