package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/marconihub/marconi"
)

// configCheck is `marconi config check`: it fails on what would bite at run
// time, each problem named: a MARCONI_* variable one edit from a setting's
// name (the setting it meant is silently at its default), lan or cloud with
// no admin token or no API key, and a database that cannot be reached.
func (c cli) configCheck(ctx context.Context, cfg Config) error {
	var problems []string
	if c.environ != nil {
		for _, u := range unknownVariables(c.environ()) {
			if u.typo {
				problems = append(problems, fmt.Sprintf("%s is not a setting: did you mean %s? (as it stands it is ignored)", u.name, u.nearest))
			}
		}
	}
	production := cfg.Hub.Mode != "development"
	if production && cfg.Hub.AdminToken == "" {
		problems = append(problems, fmt.Sprintf("MARCONI_ADMIN_TOKEN: empty in %s mode: /v1/ops/*, the dashboard and making API keys are refused to everyone", cfg.Hub.Mode))
	}
	if p := insecurePublicURL(cfg); p != "" {
		problems = append(problems, p)
	}
	stored := 0
	if cfg.DatabaseURL != "" {
		if err := checkStore(ctx, cfg.DatabaseURL, cfg.Hub.StoreTimeout); err != nil {
			return fmt.Errorf("MARCONI_DATABASE_URL: %w", err)
		}
		fmt.Fprintln(c.stdout, "store: reachable")
		var err error
		if stored, err = storedAPIKeys(ctx, cfg.DatabaseURL, cfg.Hub.StoreTimeout); err != nil {
			return fmt.Errorf("MARCONI_DATABASE_URL: count the API keys in the store: %w", err)
		}
	}
	if production && len(cfg.Hub.APIKeys) == 0 && stored == 0 {
		where := "and the store holds none"
		if cfg.DatabaseURL == "" {
			where = "and the in-memory store starts with none"
		}
		problems = append(problems, fmt.Sprintf("MARCONI_API_KEYS: empty in %s mode %s: no agent can register", cfg.Hub.Mode, where))
	}
	switch len(problems) {
	case 0:
		fmt.Fprintln(c.stdout, "configuration ok")
		return nil
	case 1:
		return usagef("%s", problems[0])
	}
	return usagef("%d problems:\n  %s", len(problems), strings.Join(problems, "\n  "))
}

// storedAPIKeys counts the API keys made through /v1/ops/api_keys and kept
// in the store (0 before the schema is migrated).
func storedAPIKeys(ctx context.Context, dbURL string, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return 0, errors.New("malformed database URL")
	}
	defer pool.Close()
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('api_keys') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		return 0, err
	}
	var n int
	err = pool.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&n)
	return n, err
}

// insecurePublicURL names the problem of a cloud hub publishing a plain
// http:// MARCONI_PUBLIC_URL on a host other than loopback; "" when there is
// none. Clients reach a cloud fleet over https, and both clients refuse to
// take a session token from an https hub to an http address
// (recipient_instance_url, wrong_instance): holder-routed sends would go
// through the balancer, and sticky sessions sent to another instance would
// not attach. A lan hub may well be http throughout.
func insecurePublicURL(cfg Config) string {
	if cfg.Hub.Mode != marconi.Cloud {
		return ""
	}
	u, err := url.Parse(cfg.Hub.PublicURL)
	if err != nil || u.Scheme != "http" {
		return ""
	}
	if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
		return ""
	}
	return fmt.Sprintf("MARCONI_PUBLIC_URL: %s is plain http in cloud mode: clients of an https fleet will not send a session token there (wrong_instance, recipient_instance_url); publish an https:// URL", cfg.Hub.PublicURL)
}
