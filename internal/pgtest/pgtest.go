package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/marconihub/marconi/migrations"
)

// Environment variables read by this package.
const (
	// EnvDatabaseURL names the Postgres database the tests may use.
	EnvDatabaseURL = "MARCONI_TEST_DATABASE_URL"
	// EnvRequire, set to 1, turns a missing EnvDatabaseURL into a failure.
	EnvRequire = "MARCONI_TEST_REQUIRE_POSTGRES"
)

// setupTimeout bounds creating and dropping a schema and migrating it.
const setupTimeout = 30 * time.Second

// DatabaseURL returns MARCONI_TEST_DATABASE_URL. Without it the test is
// skipped, or fails when MARCONI_TEST_REQUIRE_POSTGRES=1.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv(EnvDatabaseURL)
	if u != "" {
		return u
	}
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s is not set and %s=1: Postgres tests must run", EnvDatabaseURL, EnvRequire)
	}
	t.Skipf("skipping Postgres test: %s is not set", EnvDatabaseURL)
	return ""
}

// EmptySchema creates a fresh, empty schema t_<random> and returns a URL
// whose search_path is that schema. The schema is dropped, with everything
// in it, in t.Cleanup. It skips like DatabaseURL.
func EmptySchema(t testing.TB) string {
	t.Helper()
	base := DatabaseURL(t)
	schema := "t_" + randomHex(8)

	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", EnvDatabaseURL, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("pgtest: create schema %s: %v", schema, err)
	}
	t.Cleanup(func() { dropSchema(t, base, schema) })

	u, err := WithSearchPath(base, schema)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// Schema is EmptySchema with every migration applied: the returned URL
// points at a schema ready for pgstore.
func Schema(t testing.TB) string {
	t.Helper()
	u := EmptySchema(t)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("pgtest: migrate up: %v", err)
	}
	return u
}

// WithSearchPath returns databaseURL with its search_path set to schema.
// Both URL (postgres://) and keyword/value connection strings are accepted.
func WithSearchPath(databaseURL, schema string) (string, error) {
	if !strings.HasPrefix(databaseURL, "postgres://") && !strings.HasPrefix(databaseURL, "postgresql://") {
		return databaseURL + " search_path=" + schema, nil
	}
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func dropSchema(t testing.TB, base, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Errorf("pgtest: connect to drop schema %s: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		t.Errorf("pgtest: drop schema %s: %v", schema, err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b)
}

// KeywordValue returns the keyword/value form (host=… port=… dbname=…) of a
// postgres:// URL, each query parameter a keyword of its own, so that a
// test can give the hub the form libpq's users write.
func KeywordValue(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return "", err
	}
	var hosts, ports []string
	for _, hp := range strings.Split(u.Host, ",") {
		h, p, ok := strings.Cut(hp, ":")
		if !ok {
			p = "5432"
		}
		hosts, ports = append(hosts, h), append(ports, p)
	}
	kv := []string{"host=" + quoteValue(strings.Join(hosts, ",")), "port=" + quoteValue(strings.Join(ports, ","))}
	if u.User != nil {
		kv = append(kv, "user="+quoteValue(u.User.Username()))
		if pw, ok := u.User.Password(); ok {
			kv = append(kv, "password="+quoteValue(pw))
		}
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		kv = append(kv, "dbname="+quoteValue(db))
	}
	q := u.Query()
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		kv = append(kv, k+"="+quoteValue(q.Get(k)))
	}
	return strings.Join(kv, " "), nil
}

// quoteValue quotes a keyword/value string's value as libpq reads it.
func quoteValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
