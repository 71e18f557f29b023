package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// subcommands are the runs other than the default load: each parses its own
// flags. Without one of these names first, the arguments are the load's.
var subcommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	// compare runs marconi, the floor and Centrifugo (-centrifugo) as
	// processes of their own and prints their figures side by side.
	"compare": compare,
	// floor is the bare coder/websocket server that compare runs.
	"floor": func(ctx context.Context, args []string, _, stderr io.Writer) error { return floor(ctx, args, stderr) },
	// storm restarts a hub on Postgres under attached Go clients and
	// measures how fast they are all back, and that no signal is lost.
	"storm": storm,
	// durable starts hubs on Postgres and measures durable sends at 1, 8
	// and 64 senders, group commit on and off, recipients local and remote.
	"durable": durableCmd,
	// fleet measures the durable load against one instance and against
	// three behind HAProxy, interleaved, with commits and CPU per send.
	"fleet": fleetCmd,
}

func runSub(ctx context.Context, name string, sub func(context.Context, []string, io.Writer, io.Writer) error, args []string, stdout, stderr io.Writer) int {
	err := sub(ctx, args, stdout, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "marconi-bench %s: %v\n", name, err)
		return 1
	}
	return 0
}
