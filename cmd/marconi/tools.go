package main

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// healthcheck is `marconi healthcheck URL`: for container health checks on
// images without curl.
func healthcheck(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return usagef("usage: marconi healthcheck URL")
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args[0], nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", args[0], resp.Status)
	}
	return nil
}
