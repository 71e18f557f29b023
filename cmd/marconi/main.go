// Command marconi runs the Marconi hub.
//
//	marconi [serve] [flags]          run the hub (the default)
//	marconi migrate up|down|version  apply, step back or inspect the Postgres schema
//	marconi config [check]           print the effective configuration, or validate it
//	marconi version                  print the version and build information
//	marconi demo                     tell the SPEC-168 self-heal story with two agents
//	marconi attach URL TOKEN         hold a session's WebSocket, print and ack its signals
//	marconi healthcheck URL          exit 0 when URL answers 200 (container health checks)
//	marconi buskey show|rotate URL   show or rotate the key that seals wake-ups between instances
//	marconi route URL T/P/S          why a session is reachable or not; and sessions, signals,
//	                                 disconnect, deregister, fabric, apikey (docs/operations.md)
//	marconi mcp [flags]              an MCP server for one agent (docs/mcp.md)
//
// Every setting is an environment variable and a flag: MARCONI_FOO_BAR is
// --foo-bar. See docs/operations.md.
//
// Exit codes: 0 success (and -h on every command), 1 a failure or a refusal
// at run time, 2 a usage error (bad flag, unknown command, bad configuration
// value, a migrate down unconfirmed without a terminal).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/term"
)

func main() {
	c := cli{
		getenv:   os.Getenv,
		environ:  os.Environ,
		stdin:    os.Stdin,
		terminal: isTerminal(os.Stdin),
		// A secret typed at the terminal is not shown as it is typed.
		readSecret: func() ([]byte, error) { return term.ReadPassword(int(os.Stdin.Fd())) },
		stdout:     os.Stdout,
		stderr:     os.Stderr,
	}
	os.Exit(c.run(context.Background(), os.Args[1:]))
}

// cli is the process's surroundings, injected so tests run commands in-process.
type cli struct {
	getenv  func(string) string
	environ func() []string // KEY=value pairs, for the unknown-variable warning; nil: none
	stdin   io.Reader
	// terminal says stdin is an interactive terminal (a confirmation may be asked).
	terminal bool
	// readSecret reads one line from that terminal without echoing it; nil:
	// a secret is read from stdin as any line is.
	readSecret     func() ([]byte, error)
	stdout, stderr io.Writer
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	return cli{getenv: getenv, stdout: stdout, stderr: stderr}.run(ctx, args)
}

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// exitError ends a command with an exit code of its own (attach's
// exitSessionEnded), its message one line on stderr as any error's.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// commands lists the subcommands, in the order usage shows them.
var commands = []struct{ name, args, help string }{
	{"serve", "[flags]", "run the hub (the default command)"},
	{"migrate", "up|down [N|--all]|version", "apply, step back (listing what it drops) or show the Postgres schema"},
	{"config", "[check] [flags]", "print the effective configuration (secrets masked), or validate it"},
	{"version", "", "print the version and build information"},
	{"demo", "", "the SPEC-168 self-heal story with two agents, in one process"},
	{"attach", "HUB_URL SESSION_TOKEN", "hold a session's WebSocket; print and ack its signals"},
	{"healthcheck", "URL", "exit 0 when URL answers 200 (container health checks)"},
	{"buskey", "show|rotate [HUB_URL]", "show or rotate the key that seals wake-ups between instances (admin)"},
	{"route", "[HUB_URL] T/P/S [--json]", "why a session is reachable or not: state, holder, proof of life (admin)"},
	{"sessions", "[HUB_URL] [--state S] [flags]", "the live sessions and their route states (admin)"},
	{"signals", "[HUB_URL] T/P/S [--limit N]", "a session's unacknowledged signals (admin)"},
	{"disconnect", "[HUB_URL] T/P/S [--follow]", "close a session's WebSocket so that its client reconnects (admin)"},
	{"deregister", "[HUB_URL] T/P/S [--yes]", "end a session and delete its signals (admin)"},
	{"fabric", "[HUB_URL] [--json]", "the instances, their health and load, and the session totals (admin)"},
	{"apikey", "create [HUB_URL] T P | revoke", "make an API key (printed once), or revoke one read from stdin (admin)"},
	{"mcp", "[flags]", "an MCP server (stdio, or streamable HTTP with --http) that puts one agent on the hub: docs/mcp.md"},
}

// commandAbout is what each command does, as its -h prints it under the
// usage line. "config check" is config's subcommand.
var commandAbout = map[string]string{
	"serve": "Runs the hub until SIGINT or SIGTERM, then shuts down gracefully. With no MARCONI_DATABASE_URL\n" +
		"it runs on the embedded in-memory store. Every setting is a flag below and a MARCONI_* variable.",
	"config": "Prints every setting's effective value and where it came from (flag, env or default), secrets\n" +
		"masked. 'marconi config check' validates instead. Takes the same flags as serve.",
	"config check": "Validates the configuration as serve would read it, and fails on what would bite at run time:\n" +
		"lan or cloud with no API key or no admin token, a MARCONI_* variable one edit (a letter added,\n" +
		"dropped, changed, or two swapped) away from a setting's name. With MARCONI_DATABASE_URL it\n" +
		"reaches the database and names what is wrong.",
	"version": "Prints the module version, VCS revision and Go version the binary was built from.",
	"demo": "Tells SPEC-168's self-heal story step by step: an in-memory hub and two agents (the Go client)\n" +
		"in one process. Needs nothing else and changes nothing outside the process.",
	"attach": "Holds a session's WebSocket, prints every frame and acks each signal, until Ctrl-C.\n" +
		"SESSION_TOKEN is the token the session's registration answered. A close with 1012 (a restart, a\n" +
		"drain, an operator's disconnect) or a dropped connection is reconnected with backoff, said on stderr.\n" +
		"Exit codes: 0 Ctrl-C; 3 the hub ended the session (4410, or 410 to a reattach): register again;\n" +
		"1 a newer connection replaced it (4409), or an attach was refused.",
	"healthcheck": "Exits 0 when URL answers 200 within 3 s, else 1 (for container health checks, e.g. URL/readyz).",
	"buskey": "Shows the version of the bus key (the key that seals the signals wake-ups carry between\n" +
		"instances) or, with rotate, replaces it with a new random key: every instance seals with it within\n" +
		"MARCONI_BUS_KEY_REFRESH_SECONDS, and the key before still opens for MARCONI_BUS_KEY_GRACE_SECONDS.\n" +
		"Talks to HUB_URL's ops API; the key is never shown.\n" +
		opsCommon,
	"route": "Prints a session's route state and what it means: which instance holds its WebSocket and whether\n" +
		"that instance is healthy, its freshest proof of life and its age, its pending signals, its\n" +
		"self-heal tokens. An unknown session is not_registered (exit 0). --json prints the hub's object.\n" +
		opsCommon,
	"sessions": "Lists the live sessions, one a line: route state, the instance of its queue, the age of its\n" +
		"proof of life, its pending signals. --state takes attached, route_without_queue or stale.\n" +
		opsCommon,
	"signals": "Lists a session's unacknowledged signals, oldest first: id, seq, sender, kind and age.\n" +
		opsCommon,
	"disconnect": "Closes the session's WebSocket with 1012: its client reconnects as after a restart and nothing is\n" +
		"lost. Only the instance holding it can: another names that instance and its URL and the command\n" +
		"exits 1, unless --follow asks that instance in turn.\n" +
		opsCommon,
	"deregister": "Ends the session as its own DELETE /v1/session would: it and its signals are deleted and its\n" +
		"WebSocket is closed (4410). On a terminal it shows the session and asks for \"yes\"; without one,\n" +
		"--yes is required.\n" +
		opsCommon,
	"fabric": "Prints every instance (URL, health, draining, process, sticky sessions, attached queues, last\n" +
		"heartbeat, bus key version) and the cluster's session totals. --json prints the hub's summary.\n" +
		opsCommon,
	"apikey": "create prints a new API key of TENANT and PROJECT on stdout, alone, once: the hub keeps only its\n" +
		"hash. revoke reads the key from stdin (never the command line, where shell history and ps keep\n" +
		"it): 'marconi apikey revoke HUB_URL < key-file'; on a terminal it asks, and what is typed does not\n" +
		"show. A revoked key authenticates nothing, on every instance; sessions it registered keep their\n" +
		"tokens until they expire.\n" +
		opsCommon,
}

// opsCommon closes the help of every operator's command.
const opsCommon = "HUB_URL may be left out when MARCONI_HUB_URL names the hub; T/P/S is TENANT/PROJECT/SESSION.\n" +
	"The admin token is read from MARCONI_ADMIN_TOKEN only, and never printed. Exits 1 on the hub's\n" +
	"refusal, naming its code; 2 on a usage error."

// commandHelp is a command's usage line and what it does, for its -h.
func commandHelp(cmd string) string {
	name, _, _ := strings.Cut(cmd, " ")
	args := ""
	for _, k := range commands {
		if k.name == name {
			args = k.args
		}
	}
	if cmd == "config check" {
		args = "[flags]"
	}
	return strings.TrimSpace("usage: marconi "+cmd+" "+args) + "\n\n" + commandAbout[cmd]
}

// plainArgs reads the arguments of a command that takes no flags: -h prints
// its usage (flag.ErrHelp), any other flag is a usage error.
func (c cli) plainArgs(cmd string, args []string) ([]string, error) {
	fs := flag.NewFlagSet("marconi "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	pos, err := parseInterleaved(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(c.stdout, commandHelp(cmd))
		return nil, err
	}
	if err != nil {
		return nil, usagef("%v (it takes no flags; run 'marconi %s -h')", err, cmd)
	}
	return pos, nil
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: marconi <command> [arguments]")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %-36s %s\n", c.name, c.args, c.help)
	}
	fmt.Fprintln(w, "\n'marconi help CMD' or 'marconi CMD -h' prints a command's own usage.")
	fmt.Fprintln(w, "Every setting is an environment variable MARCONI_FOO and a flag --foo: run 'marconi serve -h'.")
}

func (c cli) run(ctx context.Context, args []string) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	} else if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		cmd, args = "help", nil
	} else if len(args) > 0 && (args[0] == "-version" || args[0] == "--version") {
		cmd, args = "version", nil
	}
	var err error
	switch cmd {
	case "serve":
		err = c.serve(ctx, args)
	case "migrate":
		err = c.migrate(ctx, args)
	case "config":
		err = c.config(ctx, args)
	case "version", "demo", "attach", "healthcheck", "buskey":
		if args, err = c.plainArgs(cmd, args); err == nil {
			err = c.runPlain(ctx, cmd, args)
		}
	case "mcp":
		err = c.mcpCommand(ctx, args)
	case "route", "sessions", "signals", "disconnect", "deregister", "fabric", "apikey":
		err = opsCommands[cmd](c, ctx, args)
	case "help":
		if len(args) > 0 { // help CMD [SUB] is CMD [SUB] -h
			cmd := args[:1:1]
			if len(args) > 1 && (args[0] == "migrate" || args[0] == "config") {
				cmd = args[:2:2]
			}
			return c.run(ctx, append(cmd, "-h"))
		}
		usage(c.stdout)
		return 0
	default:
		msg := fmt.Sprintf("unknown command %q", cmd)
		names := make([]string, len(commands))
		for i, k := range commands {
			names[i] = k.name
		}
		if s := closest(cmd, names); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		fmt.Fprintf(c.stderr, "marconi: %s; run 'marconi help'\n", msg)
		return 2
	}
	var ue usageError
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "marconi %s: %v\n", cmd, err)
		return 2
	case errors.As(err, &ee):
		fmt.Fprintf(c.stderr, "marconi %s: %v\n", cmd, err)
		return ee.code
	default:
		fmt.Fprintf(c.stderr, "marconi %s: %v\n", cmd, err)
		return 1
	}
}

// runPlain runs a command that takes no flags.
func (c cli) runPlain(ctx context.Context, cmd string, args []string) error {
	switch cmd {
	case "version":
		return c.version(args)
	case "demo":
		return demo(ctx, args, c.stdout)
	case "attach":
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		return attach(ctx, args, c.stdout, c.stderr)
	case "buskey":
		return c.buskey(ctx, args)
	default:
		return healthcheck(ctx, args)
	}
}

func (c cli) serve(ctx context.Context, args []string) error {
	cfg, err := c.loadConfig("serve", args)
	if err != nil {
		return err
	}
	if err := keepDevCredentials(&cfg, c.getenv); err != nil {
		return err
	}
	if p := insecurePublicURL(cfg); p != "" {
		fmt.Fprintf(c.stderr, "marconi serve: warning: %s\n", p)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain(cfg, c.stdout)
	if err := m.Run(ctx); err != nil {
		m.Close()
		return err
	}
	<-ctx.Done()
	fmt.Fprintln(c.stdout, "marconi: shutting down")
	return m.Close()
}

// loadConfig is LoadConfig for a command: -h prints the settings to stdout
// (flag.ErrHelp), a bad flag or value is a usage error, and unknown MARCONI_*
// variables are warned about on stderr.
func (c cli) loadConfig(cmd string, args []string) (Config, error) {
	cfg, err := loadConfig(cmd, args, c.getenv, c.stdout)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, err
		}
		return cfg, usageError{err.Error()}
	}
	if c.environ != nil {
		for _, u := range unknownVariables(c.environ()) {
			if u.typo && cmd == "config check" {
				continue // an error there, not a warning (configCheck)
			}
			fmt.Fprintf(c.stderr, "marconi %s: warning: %s\n", cmd, u)
		}
	}
	return cfg, nil
}
