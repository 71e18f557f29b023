package mcpbridge

import (
	"path/filepath"

	"github.com/marconihub/marconi/bootstrap-client"
)

// withState has the client keep its session token in the state directory,
// one 0600 file per session (<state-dir>/<session>.json), so that the next
// start of the bridge resumes the session, and take the session over when
// asked.
func withState(c bootstrap.Config, cfg Config) bootstrap.Config {
	if f := cfg.StateFile(); f != "" {
		c.TokenStore = bootstrap.FileTokenStore(f)
	}
	c.Takeover = cfg.Takeover
	return c
}

// StateFile is the file in the state directory that keeps the session's
// token (<state-dir>/<session>.json); empty when none is kept.
func (c Config) StateFile() string {
	if c.StateDir == "" || c.SessionID == "" {
		return ""
	}
	return filepath.Join(c.StateDir, c.SessionID+".json")
}
