package main

import (
	"context"
	"fmt"
	"io"

	"github.com/marconihub/marconi/migrations"
)

// migrate is `marconi migrate up|down|version`.
func migrate(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	url := getenv("MARCONI_DATABASE_URL")
	if len(args) != 1 || url == "" {
		return errUsage
	}
	switch args[0] {
	case "up":
		if err := migrations.Up(ctx, url); err != nil {
			return err
		}
	case "down":
		if err := migrations.Down(ctx, url); err != nil {
			return err
		}
	case "version":
	default:
		return errUsage
	}
	v, dirty, err := migrations.Version(url)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "schema version %d (dirty %v)\n", v, dirty)
	return nil
}
