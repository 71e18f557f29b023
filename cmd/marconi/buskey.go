package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// buskeyTimeout bounds one call of `marconi buskey` to the hub.
const buskeyTimeout = 10 * time.Second

// busKeyAnswer is the hub's answer on /v1/ops/bus_key (docs/api.md).
type busKeyAnswer struct {
	Version         int64     `json:"version"`
	RotatedAt       time.Time `json:"rotated_at"`
	InstanceID      string    `json:"instance_id"`
	InstanceVersion int64     `json:"instance_version"`
	RefreshSeconds  float64   `json:"refresh_seconds"`
}

// buskey is `marconi buskey show|rotate HUB_URL`: the bus key's version, or
// a new key, through the hub's ops API with the admin token of
// MARCONI_ADMIN_TOKEN. The key itself is never shown.
func (c cli) buskey(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] != "show" && args[0] != "rotate" {
		msg := fmt.Sprintf("unknown buskey command %q", args[0])
		if s := closest(args[0], []string{"show", "rotate"}); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return usagef("%s; usage: marconi buskey show|rotate HUB_URL", msg)
	}
	if len(args) != 2 {
		return usagef("usage: marconi buskey show|rotate HUB_URL")
	}
	token := c.getenv("MARCONI_ADMIN_TOKEN")
	if token == "" {
		return usagef("MARCONI_ADMIN_TOKEN is not set: the bus key is the admin's (set it to the hub's admin token)")
	}
	method, path := http.MethodGet, "/v1/ops/bus_key"
	if args[0] == "rotate" {
		method, path = http.MethodPost, "/v1/ops/bus_key/rotate"
	}
	ctx, cancel := context.WithTimeout(ctx, buskeyTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(args[1], "/")+path, nil)
	if err != nil {
		return usagef("HUB_URL %q: %v", args[1], err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the hub: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("read the hub's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(body, &e) != nil || e.Error.Code == "" {
			return fmt.Errorf("the hub answered %s", resp.Status)
		}
		return fmt.Errorf("%s (%s): %s", e.Error.Code, resp.Status, e.Error.Message)
	}
	var a busKeyAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return fmt.Errorf("the hub's answer is not a bus key's: %w", err)
	}
	if args[0] == "rotate" {
		fmt.Fprintf(c.stdout, "bus key rotated: version %d, current since %s\n", a.Version, a.RotatedAt.Format(time.RFC3339))
		fmt.Fprintf(c.stdout, "instance %s seals with it now; every instance does within %s (marconi_bus_key_version on each)\n",
			a.InstanceID, time.Duration(a.RefreshSeconds*float64(time.Second)))
		return nil
	}
	fmt.Fprintf(c.stdout, "bus key version %d, current since %s\n", a.Version, a.RotatedAt.Format(time.RFC3339))
	fmt.Fprintf(c.stdout, "instance %s seals with version %d\n", a.InstanceID, a.InstanceVersion)
	return nil
}
