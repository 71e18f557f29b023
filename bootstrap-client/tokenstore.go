package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// SessionToken is a session's id and its current token, as a TokenStore
// keeps them between runs of the agent, with the session's tenant and
// project: a restarted agent names them (X-Marconi-Project) from its first
// request, so that a balancer hashing on the project sends its resume and
// attach to the project's instance. A token kept without them (an older
// client, a store that drops them) still resumes; the header then waits for
// the hub's answer.
type SessionToken struct {
	SessionID string `json:"session_id"`
	Token     string `json:"token"`
	TenantID  string `json:"tenant_id,omitempty"`
	ProjectID string `json:"project_id,omitempty"`
}

// ErrProjectDropped is wrapped by the error a TokenStore's Load returns
// beside a usable token whose kept tenant or project it could not read (a
// hand-edited file with "tenant_id": 5): the returned token holds neither,
// Dial logs the error at warn level and resumes with the token, and the
// project is named from the hub's answer on. The error never holds the
// token.
var ErrProjectDropped = errors.New("the kept tenant or project is not a string: dropped, resuming without it")

// TokenStore keeps the session token across restarts of the agent, so that a
// restarted agent resumes its session (X-Marconi-Session-Token) instead of
// being refused as another holder of a live id. Dial loads it once; the
// client saves every new token the hub gives it (registration, resume,
// re-registration, takeover). Implementations must be safe for concurrent
// use.
type TokenStore interface {
	// Load returns the kept token, or the zero SessionToken and nil when
	// nothing is kept. An error wrapping ErrProjectDropped comes with the
	// token, read without its tenant and project; any other error stops
	// Dial.
	Load(ctx context.Context) (SessionToken, error)
	// Save replaces the kept token with t.
	Save(ctx context.Context, t SessionToken) error
}

// FileTokenStore keeps the token in a JSON file at path ({"session_id",
// "token", "tenant_id", "project_id"}; a file without the last two, as older
// clients wrote it, still loads; one where either is not a string loads
// without both, with an error wrapping ErrProjectDropped; one with a
// session_id without a token, or either not a string, is an error),
// readable by its owner only (0600), replaced atomically (a temporary file
// renamed over it) so a crash mid-write leaves the old token or the new
// one, never half of either. Its directory is created (0700) when missing.
// The token is a credential of the session: keep the file where only the
// agent's user can read it.
func FileTokenStore(path string) TokenStore {
	return &fileTokenStore{path: path}
}

type fileTokenStore struct {
	path string
	mu   sync.Mutex // serializes saves of this process
}

func (f *fileTokenStore) Load(context.Context) (SessionToken, error) {
	data, err := os.ReadFile(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return SessionToken{}, nil
	}
	if err != nil {
		return SessionToken{}, fmt.Errorf("bootstrap: read token file: %w", err)
	}
	// The tenant and project are routing hints for the balancer: read
	// apart, so that one of another JSON type costs the hint, not the token.
	var kept struct {
		SessionID string          `json:"session_id"`
		Token     string          `json:"token"`
		TenantID  json.RawMessage `json:"tenant_id"`
		ProjectID json.RawMessage `json:"project_id"`
	}
	if err := json.Unmarshal(data, &kept); err != nil {
		return SessionToken{}, fmt.Errorf("bootstrap: token file %s is not a kept session token: %w", f.path, err)
	}
	t := SessionToken{SessionID: kept.SessionID, Token: kept.Token}
	if (t.SessionID == "") != (t.Token == "") {
		return SessionToken{}, fmt.Errorf("bootstrap: token file %s holds a session id or a token without the other", f.path)
	}
	tenant, tenantOK := hint(kept.TenantID)
	project, projectOK := hint(kept.ProjectID)
	switch {
	case !tenantOK:
		return t, fmt.Errorf("bootstrap: token file %s: tenant_id: %w", f.path, ErrProjectDropped)
	case !projectOK:
		return t, fmt.Errorf("bootstrap: token file %s: project_id: %w", f.path, ErrProjectDropped)
	}
	t.TenantID, t.ProjectID = tenant, project
	return t, nil
}

// hint reads a kept tenant or project: absent or null is "", a JSON string
// its value; anything else is not readable (false).
func hint(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 {
		return "", true
	}
	var s *string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false
	}
	if s == nil {
		return "", true
	}
	return *s, true
}

func (f *fileTokenStore) Save(_ context.Context, t SessionToken) error {
	data, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("bootstrap: encode token: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	dir := filepath.Dir(f.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bootstrap: token file directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.path)+".*")
	if err != nil {
		return fmt.Errorf("bootstrap: write token file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename there is nothing left to remove
	if err := writeSynced(tmp, data); err != nil {
		return fmt.Errorf("bootstrap: write token file: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("bootstrap: write token file: %w", err)
	}
	return nil
}

// writeSynced writes data to a file made 0600 and closes it once it is on
// disk.
func writeSynced(f *os.File, data []byte) error {
	err := f.Chmod(0o600)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}
