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
	if cfg.StateDir != "" {
		c.TokenStore = bootstrap.FileTokenStore(statePath(cfg))
	}
	c.Takeover = cfg.Takeover
	return c
}

// statePath is the file that keeps the session's token.
func statePath(cfg Config) string {
	return filepath.Join(cfg.StateDir, cfg.SessionID+".json")
}
