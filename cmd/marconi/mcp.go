package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/marconihub/marconi"
	bootstrap "github.com/marconihub/marconi/bootstrap-client"
	"github.com/marconihub/marconi/mcpbridge"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpSetting is one setting of `marconi mcp`: a flag and its variable.
type mcpSetting struct {
	flag, env, help string
	bool            bool
}

// mcpSettings lists the settings of `marconi mcp` (docs/mcp.md).
var mcpSettings = []mcpSetting{
	{"hub", "MARCONI_HUB_URL", "the hub's URL, or several comma-separated to fail over (required)", false},
	{"api-key", "MARCONI_API_KEY", "a project API key of the hub (required)", false},
	{"session", "MARCONI_SESSION_ID", "the agent's name on the hub, its session id; empty lets the hub choose", false},
	{"surface", "MARCONI_SURFACE", "claude_code, codex, headless_cc, headless_cx or console_<name> (default " + mcpbridge.DefaultSurface + ")", false},
	{"runtime-mode", "MARCONI_RUNTIME_MODE", "stateless or sticky; empty lets the hub decide", false},
	{"state-dir", "MARCONI_STATE_DIR", "where the session token is kept (0600) so a restarted host resumes its session; " +
		"default $XDG_STATE_HOME/marconi/mcp or ~/.local/state/marconi/mcp when --session is set; none keeps nothing", false},
	{"takeover", "MARCONI_TAKEOVER", "take the session over when it is live under a token this host does not hold", true},
	{"deregister-on-exit", "MARCONI_DEREGISTER_ON_EXIT", "end the session when the server exits (default: it lives until its TTL)", true},
	{"http", "MARCONI_MCP_HTTP_ADDR", "serve MCP's streamable HTTP transport on this address at /mcp instead of stdio", false},
	{"inbox-size", "MARCONI_MCP_INBOX_SIZE", "signals held for the host before the server stops reading the hub (default " + strconv.Itoa(mcpbridge.DefaultInboxSize) + ")", false},
}

// mcpCommand runs `marconi mcp`: an MCP server for one agent, on stdio
// unless --http. stdout carries MCP only; diagnostics go to stderr.
func (c cli) mcpCommand(ctx context.Context, args []string) error {
	cfg, err := c.loadMCPConfig(args)
	if err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.Version = readBuildInfo().Version
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// A host gone mid-answer: the write fails (EPIPE) and is handled, instead
	// of the process dying on SIGPIPE before it has closed the session.
	pipe := make(chan os.Signal, 1)
	signal.Notify(pipe, syscall.SIGPIPE)
	defer signal.Stop(pipe)

	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	b, err := mcpbridge.New(dctx, cfg)
	cancel()
	if err != nil {
		hint := joinHint(err, cfg)
		var he *bootstrap.Error
		if hint != "" && errors.As(err, &he) {
			err = he // the hint says it in the server's flags, not in the Go client's fields
		}
		return fmt.Errorf("join the hub: %w%s", err, hint)
	}
	if cfg.HTTPAddr != "" {
		err = b.ServeHTTP(ctx, func(addr string) {
			cfg.Logger.Info("marconi mcp: serving streamable HTTP", "url", "http://"+addr+"/mcp")
		})
	} else {
		err = b.Serve(ctx, c.stdio())
	}
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return errors.Join(err, b.Close(cctx))
}

// joinHint says what to do about a hub's refusal to let the server join, in
// the server's own flags: the hub's message speaks of HTTP headers and fields.
func joinHint(err error, cfg mcpbridge.Config) string {
	var he *bootstrap.Error
	if !errors.As(err, &he) {
		if ne := net.Error(nil); errors.As(err, &ne) {
			return fmt.Sprintf("; no hub answers at %s: start it (marconi serve), or give --hub (MARCONI_HUB_URL) the URL it prints",
				strings.Join(cfg.HubURLs, ", "))
		}
		return ""
	}
	switch {
	case he.Code == marconi.CodeUnauthorized:
		return "; --api-key (MARCONI_API_KEY) is not a key of this hub: use the one a development hub prints at start, or one of its MARCONI_API_KEYS"
	case he.Code == marconi.CodeForbidden && cfg.SessionID != "" && !cfg.Takeover:
		if f := cfg.StateFile(); f != "" && fileExists(f) {
			return fmt.Sprintf("; session %q is live under a newer token than the one kept in %s: another marconi mcp "+
				"with this --session resumed it or took it over (a host that started the server twice, or another host "+
				"with this state directory): stop the other one, start with --takeover (MARCONI_TAKEOVER=true) to take it "+
				"from it, or choose another --session", cfg.SessionID, f)
		}
		where := "no state directory is kept (--state-dir none)"
		if cfg.StateDir != "" {
			where = "its state directory " + cfg.StateDir + " holds no token for it"
		}
		return fmt.Sprintf("; another host holds session %q, or this one lost its token (%s): "+
			"start with --takeover (MARCONI_TAKEOVER=true) to take it over, or choose another --session", cfg.SessionID, where)
	}
	return ""
}

// fileExists reports whether path names a file that can be stat'ed.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// stdio is the MCP transport on the command's stdin and stdout.
func (c cli) stdio() mcp.Transport {
	in, ok := c.stdin.(io.ReadCloser)
	if !ok {
		in = io.NopCloser(c.stdin)
	}
	return &mcp.IOTransport{Reader: in, Writer: nopWriteCloser{c.stdout}}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// loadMCPConfig reads the settings of `marconi mcp`: a flag wins over its
// variable. -h prints them (flag.ErrHelp); a bad value is a usage error.
func (c cli) loadMCPConfig(args []string) (mcpbridge.Config, error) {
	fs := flag.NewFlagSet("marconi mcp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	values := make(map[string]*string, len(mcpSettings))
	for _, s := range mcpSettings {
		// The flag's default stays empty: -h must not print a variable's
		// value (the API key is one).
		values[s.env] = new(string)
		usage := fmt.Sprintf("%s (env %s)", s.help, s.env)
		if s.bool {
			fs.Var(boolText{values[s.env]}, s.flag, usage)
		} else {
			fs.StringVar(values[s.env], s.flag, "", usage)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(c.stdout, "usage: marconi mcp [flags]\n\nAn MCP server (stdio) that puts one agent on the hub: tools send_signal, read_signals, whoami;\nresource marconi://inbox. See docs/mcp.md. Every flag is also a variable; a flag wins.")
			fs.SetOutput(c.stdout)
			fs.PrintDefaults()
			return mcpbridge.Config{}, err
		}
		return mcpbridge.Config{}, usagef("%v (run 'marconi mcp -h')", err)
	}
	if fs.NArg() > 0 {
		return mcpbridge.Config{}, usagef("unexpected arguments %q (run 'marconi mcp -h')", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, s := range mcpSettings {
		if !set[s.flag] {
			*values[s.env] = c.getenv(s.env) // a flag wins over its variable
		}
	}
	get := func(env string) string { return strings.TrimSpace(*values[env]) }
	cfg := mcpbridge.Config{
		APIKey:      get("MARCONI_API_KEY"),
		SessionID:   get("MARCONI_SESSION_ID"),
		Surface:     get("MARCONI_SURFACE"),
		RuntimeMode: get("MARCONI_RUNTIME_MODE"),
		HTTPAddr:    get("MARCONI_MCP_HTTP_ADDR"),
	}
	for _, u := range strings.Split(get("MARCONI_HUB_URL"), ",") {
		if u = strings.TrimSpace(u); u != "" {
			cfg.HubURLs = append(cfg.HubURLs, u)
		}
	}
	var err error
	if cfg.Takeover, err = parseBoolSetting("MARCONI_TAKEOVER", get("MARCONI_TAKEOVER")); err != nil {
		return cfg, err
	}
	if cfg.DeregisterOnExit, err = parseBoolSetting("MARCONI_DEREGISTER_ON_EXIT", get("MARCONI_DEREGISTER_ON_EXIT")); err != nil {
		return cfg, err
	}
	if v := get("MARCONI_MCP_INBOX_SIZE"); v != "" {
		if cfg.InboxSize, err = strconv.Atoi(v); err != nil || cfg.InboxSize < 1 {
			return cfg, usagef("--inbox-size (MARCONI_MCP_INBOX_SIZE) %q: want a positive whole number", v)
		}
	}
	cfg.StateDir = stateDir(get("MARCONI_STATE_DIR"), cfg.SessionID, c.getenv)
	if err := cfg.Validate(); err != nil {
		return cfg, usageError{err.Error()}
	}
	return cfg, nil
}

// stateDir is the state directory in use: the one given, none for "none",
// else the default under the user's state home when a session is named.
func stateDir(given, session string, getenv func(string) string) string {
	switch {
	case given == "none":
		return ""
	case given != "":
		return given
	case session == "":
		return ""
	case getenv("XDG_STATE_HOME") != "":
		return filepath.Join(getenv("XDG_STATE_HOME"), "marconi", "mcp")
	case getenv("HOME") != "":
		return filepath.Join(getenv("HOME"), ".local", "state", "marconi", "mcp")
	}
	return ""
}

func parseBoolSetting(env, v string) (bool, error) {
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, usagef("%s %q: want true or false", env, v)
	}
	return b, nil
}

// boolText is a boolean flag kept as text, so that its variable and the flag
// share one parser: --takeover alone means true.
type boolText struct{ v *string }

func (b boolText) String() string {
	if b.v == nil {
		return ""
	}
	return *b.v
}
func (b boolText) Set(s string) error { *b.v = s; return nil }
func (b boolText) IsBoolFlag() bool   { return true }
