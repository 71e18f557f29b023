package main

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// busKeyAnswer is the hub's answer on /v1/ops/bus_key (docs/api.md).
type busKeyAnswer struct {
	Version         int64     `json:"version"`
	RotatedAt       time.Time `json:"rotated_at"`
	InstanceID      string    `json:"instance_id"`
	InstanceVersion int64     `json:"instance_version"`
	RefreshSeconds  float64   `json:"refresh_seconds"`
}

// buskeyUsage is the one-line reminder a usage error of buskey ends with.
const buskeyUsage = "usage: marconi buskey show|rotate [HUB_URL]"

// buskey is `marconi buskey show|rotate [HUB_URL]`: the bus key's version,
// or a new key, through the hub's ops API with the admin token of
// MARCONI_ADMIN_TOKEN. The key itself is never shown.
func (c cli) buskey(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] != "show" && args[0] != "rotate" {
		return usagef("%s; %s", unknownSubcommand("buskey", args[0], []string{"show", "rotate"}), buskeyUsage)
	}
	if len(args) == 0 {
		return usagef(buskeyUsage)
	}
	o, _, err := c.opsTarget(args[1:], 0, buskeyUsage)
	if err != nil {
		return err
	}
	method, path := http.MethodGet, "/v1/ops/bus_key"
	if args[0] == "rotate" {
		method, path = http.MethodPost, "/v1/ops/bus_key/rotate"
	}
	answer, err := o.call(ctx, method, path, nil)
	if err != nil {
		return err
	}
	var a busKeyAnswer
	if err := answer.decode("a bus key's", &a); err != nil {
		return err
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

// unknownSubcommand names a subcommand cmd does not have, and the one of
// subs it was probably meant to be.
func unknownSubcommand(cmd, sub string, subs []string) string {
	msg := fmt.Sprintf("unknown %s command %q", cmd, sub)
	if s := closest(sub, subs); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return msg
}
