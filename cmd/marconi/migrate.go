package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/marconihub/marconi/migrations"
)

const migrateUsage = "usage: marconi migrate up | down [N] | down --all [--yes] | version (MARCONI_DATABASE_URL or --database-url names the database)"

// migrate is `marconi migrate up|down|version`. down steps back one
// migration, or N; only --all drops the whole schema, and it asks for
// confirmation on a terminal (--yes skips it; without a terminal --yes is
// required).
func (c cli) migrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("marconi migrate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dbURL := fs.String("database-url", c.getenv("MARCONI_DATABASE_URL"), "Postgres URL")
	all := fs.Bool("all", false, "down: revert every migration (drops all of Marconi's tables)")
	yes := fs.Bool("yes", false, "down --all: do not ask for confirmation")
	if len(args) == 0 {
		return usagef(migrateUsage)
	}
	sub := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprintln(c.stdout, migrateUsage)
			fs.SetOutput(c.stdout)
			fs.PrintDefaults()
			return err
		}
		return usagef("%v; %s", err, migrateUsage)
	}
	rest := fs.Args()
	if sub != "up" && sub != "down" && sub != "version" {
		return usagef("unknown migrate command %q; %s", sub, migrateUsage)
	}
	if *dbURL == "" {
		return usagef("no database: set MARCONI_DATABASE_URL or --database-url")
	}
	if (*all || *yes) && sub != "down" {
		return usagef("--all and --yes apply to down only; %s", migrateUsage)
	}
	switch sub {
	case "up", "version":
		if len(rest) > 0 {
			return usagef("unexpected arguments %q; %s", rest, migrateUsage)
		}
		if sub == "up" {
			if err := migrations.Up(ctx, *dbURL); err != nil {
				return err
			}
		}
	case "down":
		if err := c.migrateDown(ctx, *dbURL, rest, *all, *yes); err != nil {
			return err
		}
	}
	v, dirty, err := migrations.Version(*dbURL)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "schema version %d (dirty %v)\n", v, dirty)
	return nil
}

func (c cli) migrateDown(ctx context.Context, dbURL string, rest []string, all, yes bool) error {
	if all {
		if len(rest) > 0 {
			return usagef("down --all takes no count; %s", migrateUsage)
		}
		if !yes {
			if !c.terminal {
				return usagef("down --all drops every Marconi table and its data; not on a terminal, so pass --yes to confirm")
			}
			fmt.Fprint(c.stdout, "This drops every Marconi table and all its data. Type \"yes\" to go on: ")
			line, _ := bufio.NewReader(c.stdin).ReadString('\n')
			if strings.TrimSpace(line) != "yes" {
				return fmt.Errorf("not confirmed; nothing was changed")
			}
		}
		return migrations.Down(ctx, dbURL)
	}
	n := 1
	if len(rest) > 1 {
		return usagef("unexpected arguments %q; %s", rest[1:], migrateUsage)
	}
	if len(rest) == 1 {
		var err error
		n, err = strconv.Atoi(rest[0])
		if err != nil || n < 1 {
			return usagef("down takes a positive count of migrations, got %q; %s", rest[0], migrateUsage)
		}
	}
	return migrations.Steps(ctx, dbURL, -n)
}
