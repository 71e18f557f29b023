// Command marconi runs the Marconi hub.
//
//	marconi [serve]                 run the hub (the default)
//	marconi migrate up|down|version apply or inspect the Postgres schema
//	marconi demo                    tell the SPEC-168 self-heal story with two agents
//	marconi attach URL TOKEN        hold a session's WebSocket, print and ack its signals
//	marconi healthcheck URL         exit 0 when URL answers 200 (container health checks)
//
// Every setting is an environment variable and a flag: MARCONI_FOO_BAR is
// --foo-bar. See docs/operations.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && (args[0] == "serve" || args[0] == "migrate" || args[0] == "demo" || args[0] == "attach" || args[0] == "healthcheck" || args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "serve":
		err = serve(ctx, args, getenv, stdout, stderr)
	case "migrate":
		err = migrate(ctx, args, getenv, stdout)
	case "demo":
		err = demo(ctx, args, stdout)
	case "attach":
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = attach(ctx, args, stdout)
	case "healthcheck":
		err = healthcheck(ctx, args)
	default:
		fmt.Fprintln(stdout, "usage: marconi [serve [flags]] | migrate up|down|version | demo | attach URL TOKEN | healthcheck URL\n\nRun 'marconi serve -h' for every setting.")
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "marconi %s: %v\n", cmd, err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := LoadConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	m := NewMain(cfg, stdout)
	if err := m.Run(ctx); err != nil {
		m.Close()
		return err
	}
	<-ctx.Done()
	fmt.Fprintln(stdout, "marconi: shutting down")
	return m.Close()
}

var errUsage = errors.New("usage: marconi migrate up|down|version (needs MARCONI_DATABASE_URL)")
