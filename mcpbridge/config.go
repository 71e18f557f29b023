package mcpbridge

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Config is one bridge: which hub and session it holds, and how it serves
// MCP. HubURLs and APIKey are required; every other field has a default.
type Config struct {
	// HubURLs are the hub instances (or balancers) to use, the first one
	// first; the client fails over round the list.
	HubURLs []string
	APIKey  string
	// SessionID is the agent's name on the hub; empty lets the hub choose
	// (and then nothing can be resumed from StateDir).
	SessionID   string
	Surface     string // default claude_code
	RuntimeMode string // "", stateless or sticky
	// StateDir is where the session token is kept (0600), so a restarted
	// host resumes its session; empty keeps nothing.
	StateDir string
	// Takeover resumes a live session of this name without its token
	// (the hub's takeover), for a host that lost its state directory.
	Takeover bool
	// DeregisterOnExit ends the session on the hub when the bridge exits;
	// by default it lives until its TTL, for the host's next start.
	DeregisterOnExit bool
	// InboxSize bounds how many signals the bridge holds for the host
	// before it stops reading the hub (they wait there). Default 1000.
	InboxSize int
	// HTTPAddr, when set, serves MCP's streamable HTTP transport on this
	// address (path /mcp) instead of stdio.
	HTTPAddr string
	// DrainInterval is how often a read_signals that waits polls the hub
	// on a surface without a WebSocket (codex). Default 1s.
	DrainInterval time.Duration
	// Version names the build in the MCP handshake.
	Version string
	// Logger receives the bridge's and the client's diagnostics (stderr);
	// those at info level and above also go to the host as MCP log
	// messages. Nil discards them.
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultSurface   = "claude_code"
	DefaultInboxSize = 1000
	defaultDrainPoll = time.Second
	maxInboxSize     = 100000
)

var sessionIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func (c Config) withDefaults() Config {
	if c.Surface == "" {
		c.Surface = DefaultSurface
	}
	if c.InboxSize == 0 {
		c.InboxSize = DefaultInboxSize
	}
	if c.DrainInterval == 0 {
		c.DrainInterval = defaultDrainPoll
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first bad value of c, once its defaults are filled,
// naming its flag and variable. New checks the same.
func (c Config) Validate() error { return c.withDefaults().validate() }

// validate names the setting (flag and variable) of the first bad value.
func (c Config) validate() error {
	switch {
	case len(c.HubURLs) == 0:
		return errors.New("--hub (MARCONI_HUB_URL) is required: the hub's URL, or several comma-separated")
	case badHubURL(c.HubURLs) != "":
		return fmt.Errorf("--hub (MARCONI_HUB_URL) %q: want an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080", badHubURL(c.HubURLs))
	case c.APIKey == "":
		return errors.New("--api-key (MARCONI_API_KEY) is required: a project API key of the hub")
	case c.SessionID != "" && (!sessionIDPattern.MatchString(c.SessionID) || c.SessionID == "." || c.SessionID == ".."):
		return fmt.Errorf("--session (MARCONI_SESSION_ID) %q: want 1 to 128 of A-Z a-z 0-9 . _ - (not . or ..)", c.SessionID)
	case c.Surface != "codex" && c.Surface != "claude_code" && c.Surface != "headless_cc" &&
		c.Surface != "headless_cx" && !(strings.HasPrefix(c.Surface, "console_") && len(c.Surface) > len("console_")):
		return fmt.Errorf("--surface (MARCONI_SURFACE) %q: want claude_code, codex, headless_cc, headless_cx or console_<name>", c.Surface)
	case c.RuntimeMode != "" && c.RuntimeMode != "stateless" && c.RuntimeMode != "sticky":
		return fmt.Errorf("--runtime-mode (MARCONI_RUNTIME_MODE) %q: want stateless or sticky", c.RuntimeMode)
	case c.StateDir != "" && c.SessionID == "":
		return errors.New("--state-dir (MARCONI_STATE_DIR) needs --session (MARCONI_SESSION_ID): the token is kept under the session's name")
	case c.InboxSize < 1 || c.InboxSize > maxInboxSize:
		return fmt.Errorf("--inbox-size (MARCONI_MCP_INBOX_SIZE) %d: want 1 to %d", c.InboxSize, maxInboxSize)
	case c.DrainInterval < 0:
		return errors.New("drain interval must not be negative")
	}
	return nil
}

// badHubURL returns the first of urls that is not an http(s) URL with a
// host, or "" when all are.
func badHubURL(urls []string) string {
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return raw
		}
	}
	return ""
}

// piggybackOnly reports whether the surface holds no WebSocket (docs/api.md).
func (c Config) piggybackOnly() bool { return c.Surface == "codex" }
