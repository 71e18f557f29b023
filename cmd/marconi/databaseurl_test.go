package main

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/marconihub/marconi/internal/pgtest"
	"github.com/marconihub/marconi/migrations"
)

// MARCONI_DATABASE_URL takes what pgx takes: a postgres:// URL, or the
// keyword/value form, one host or several; anything else stops the process
// with an error that names the variable and never quotes the value.
func TestDatabaseURLForms(t *testing.T) {
	for _, ok := range []string{
		"postgres://marconi@db/marconi",
		"postgresql://marconi@db-a:5432,db-b:5432/marconi?target_session_attrs=read-write",
		"host=127.0.0.1 port=5432 user=postgres dbname=x sslmode=disable",
		"host=db-a,db-b port=5432,5433 user=marconi password='a b\\'c' dbname=marconi target_session_attrs=read-write pool_max_conns=8",
		"  dbname = marconi  host=/var/run/postgresql  ",
		"host=db dbname=m application_name=http://hub-a",
	} {
		c, err := LoadConfig(nil, env(map[string]string{"MARCONI_DATABASE_URL": ok}), &strings.Builder{})
		if err != nil || c.DatabaseURL != ok {
			t.Errorf("MARCONI_DATABASE_URL=%q: %q, %v; want it accepted as is", ok, c.DatabaseURL, err)
		}
	}
	for _, bad := range []string{
		"mysql://x",
		"host=127.0.0.1 port=notaport password=s3cret",
		"host=127.0.0.1 password='s3cret",
		"host 127.0.0.1 password=s3cret",
		"postgres://u:s3cret@h:notaport/db",
		"s3cret",
	} {
		_, err := LoadConfig(nil, env(map[string]string{"MARCONI_DATABASE_URL": bad}), &strings.Builder{})
		if err == nil || !strings.HasPrefix(err.Error(), "MARCONI_DATABASE_URL: want a postgres:// URL or a keyword/value string") {
			t.Errorf("MARCONI_DATABASE_URL=%q: %v; want an error naming the variable and the forms", bad, err)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("MARCONI_DATABASE_URL=%q: the error quotes the password: %v", bad, err)
		}
	}
	// A well-formed URL whose CA file is not on this machine: the error
	// says so, not that the URL is malformed.
	ca := t.TempDir() + "/no-such-ca.pem"
	for _, v := range []string{
		"postgres://u:s3cret@db.example.com/marconi?sslmode=verify-full&sslrootcert=" + ca,
		"host=db.example.com dbname=marconi password=s3cret sslmode=verify-full sslrootcert=" + ca,
	} {
		_, err := LoadConfig(nil, env(map[string]string{"MARCONI_DATABASE_URL": v, "MARCONI_PUBLIC_URL": "http://127.0.0.1:1"}), &strings.Builder{})
		if err == nil || !strings.HasPrefix(err.Error(), "MARCONI_DATABASE_URL: its TLS settings") || !strings.Contains(err.Error(), ca) ||
			strings.Contains(err.Error(), "s3cret") {
			t.Errorf("MARCONI_DATABASE_URL=%q: %v; want an error naming the TLS settings and the CA file, not the password", v, err)
		}
	}
}

// `marconi config` masks a database password in either form, read as pgx
// reads it, and keeps what helps to recognize the database.
func TestMaskDatabaseURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://marconi:s3cret@db:5432/marconi", "postgres://marconi:xxxxx@db:5432/marconi"},
		{"postgres://marconi@db/marconi?sslmode=require&password=s3cret", "postgres://marconi@db/marconi?sslmode=require&password=xxxxx"},
		{"postgres://db/m?sslpassword=s3cret&sslkey=k", "postgres://db/m?sslpassword=xxxxx&sslkey=k"},
		{"host=db user=marconi password=s3cret dbname=marconi", "host=db user=marconi password=xxxxx dbname=marconi"},
		{"host=db-a,db-b password='s3 cr\\'et' dbname=m", "host=db-a,db-b password='xxxxx' dbname=m"},
		{"password='s3cret'dbname=m", "password='xxxxx'dbname=m"},
		{"password = s3\\ cret host=db", "password = xxxxx host=db"},
		{"host=db sslpassword=s3cret", "host=db sslpassword=xxxxx"},
		// After "=", spaces are skipped: the next word is the value.
		{"host=db password= s3cret", "host=db password= xxxxx"},
		{"host=db dbname=m", "host=db dbname=m"},
		{"host=db application_name=http://a password=s3cret", "host=db application_name=http://a password=xxxxx"},
		// What pgx cannot read is masked whole.
		{"host=db password='s3cret", "****"},
		{"host=db s3cret", "****"},
	} {
		got := mask("MARCONI_DATABASE_URL", tc.in)
		if got != tc.want || strings.Contains(got, "s3") {
			t.Errorf("mask(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A keyword/value MARCONI_DATABASE_URL works end to end on the real
// Postgres: `config check` reaches it, the hub migrates and serves on it,
// `marconi migrate` reads it, and `marconi config` masks its password.
func TestKeywordValueDatabaseURL(t *testing.T) {
	u := pgtest.EmptySchema(t)
	kv, err := pgtest.KeywordValue(u)
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts loopback, so the password is never asked for.
	kv += " password='s3cret pw' pool_max_conns=4"
	vars := map[string]string{"MARCONI_DATABASE_URL": kv}
	if code, stdout, stderr := runCLI(t, vars, "", false, "config", "check"); code != 0 {
		t.Fatalf("config check: exit %d, %q %q", code, stdout, stderr)
	}
	m, out := startMain(t, map[string]string{"MARCONI_DATABASE_URL": kv})
	pollUntil(t, "the hub ready on the keyword/value URL", func() bool { st, _ := readyz(t, m.URL(), ""); return st == 200 })
	if a := post(t, m.URL()+"/v1/sessions", devKey(t, out.String()), `{"session_id":"alice","surface":"claude_code"}`); a.status != 201 {
		t.Fatalf("register: %+v", a)
	}
	if strings.Contains(out.String(), "s3cret") {
		t.Errorf("the hub's output quotes the database password:\n%s", out.String())
	}
	if code, stdout, stderr := runCLI(t, vars, "", false, "migrate", "version"); code != 0 ||
		!strings.Contains(stdout, fmt.Sprintf("schema version %d ", migrations.Latest())) {
		t.Errorf("migrate version: exit %d, %q %q", code, stdout, stderr)
	}
	code, stdout, stderr := runCLI(t, vars, "", false, "config")
	if code != 0 || strings.Contains(stdout, "s3cret") || !strings.Contains(stdout, " password='xxxxx' pool_max_conns=4\t# env\n") {
		t.Errorf("config: exit %d, %q %q; want the password masked", code, stdout, stderr)
	}
	bad := "host=127.0.0.1 port=notaport password=s3cret"
	code, _, stderr = runCLI(t, map[string]string{"MARCONI_DATABASE_URL": bad}, "", false, "config", "check")
	if code == 0 || !strings.Contains(stderr, "MARCONI_DATABASE_URL: want a postgres:// URL or a keyword/value string") || strings.Contains(stderr, "s3cret") {
		t.Errorf("config check of %q: exit %d, %q", bad, code, stderr)
	}
}

// FuzzMaskDatabaseURL: a keyword/value string that pgx reads is masked to
// one that pgx reads the same, but for its password (and sslpassword),
// which read as the mask; or, unreadable, it is masked whole.
func FuzzMaskDatabaseURL(f *testing.F) {
	f.Add("host=db user=marconi password=s3cret dbname=marconi")
	f.Add("host=db-a,db-b password='s3 cr\\'et' dbname=m sslpassword=x")
	f.Add("password = s3\\ cret host=db")
	f.Add("host=db password= s3cret")
	// A password comes from the string only.
	f.Setenv("PGPASSWORD", "")
	f.Setenv("PGPASSFILE", "/nonexistent")
	f.Fuzz(func(t *testing.T, s string) {
		if migrations.IsURL(s) {
			return
		}
		masked := mask("MARCONI_DATABASE_URL", s)
		before, err := pgconn.ParseConfig(s)
		if err != nil {
			return
		}
		if masked == "****" {
			t.Fatalf("mask(%q) masked a string pgx reads whole", s)
		}
		after, err := pgconn.ParseConfig(masked)
		if err != nil {
			t.Fatalf("mask(%q) = %q, which pgx cannot read: %v", s, masked, err)
		}
		if before.Password != "" && after.Password != "xxxxx" {
			t.Fatalf("mask(%q) = %q: password %q, want xxxxx", s, masked, after.Password)
		}
		if before.Host != after.Host || before.Port != after.Port || before.User != after.User ||
			before.Database != after.Database || !maps.Equal(before.RuntimeParams, after.RuntimeParams) {
			t.Fatalf("mask(%q) = %q, which pgx reads otherwise", s, masked)
		}
	})
}
