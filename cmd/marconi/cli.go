package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/migrations"
	"github.com/mattn/go-isatty"
)

// isTerminal reports whether f is an interactive terminal. A character
// device is not enough: /dev/null, a script's or a container's stdin, is one.
func isTerminal(f *os.File) bool {
	return isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd())
}

// buildInfo is what `marconi version` and marconi_build_info report: the
// module version, the VCS revision (with "-dirty" when the tree was
// modified) and the Go version, from runtime/debug.
type buildInfo struct {
	Version, Revision, GoVersion string
}

// revision is the VCS revision stamped at link time, for builds that carry
// no VCS information of their own (the Docker build, whose context has no
// .git): go build -ldflags "-X main.revision=$(git rev-parse HEAD)".
var revision string

// unknownRevision is the revision of a build with neither VCS information
// nor a stamped revision.
const unknownRevision = "unknown"

func readBuildInfo() buildInfo {
	info, ok := debug.ReadBuildInfo()
	return buildInfoFrom(info, ok, revision)
}

// buildInfoFrom is readBuildInfo of a given build: the VCS settings win, the
// stamped revision fills in where there are none.
func buildInfoFrom(info *debug.BuildInfo, ok bool, stamped string) buildInfo {
	b := buildInfo{Version: "(devel)", Revision: unknownRevision, GoVersion: "unknown"}
	if stamped != "" {
		b.Revision = stamped
	}
	if !ok {
		return b
	}
	b.GoVersion = info.GoVersion
	if info.Main.Version != "" {
		b.Version = info.Main.Version
	}
	var modified bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified && b.Revision != unknownRevision {
		b.Revision += "-dirty"
	}
	return b
}

func (c cli) version(args []string) error {
	if len(args) > 0 {
		return usagef("usage: marconi version (takes no arguments)")
	}
	b := readBuildInfo()
	fmt.Fprintf(c.stdout, "marconi %s (revision %s, %s)\n", b.Version, b.Revision, b.GoVersion)
	if b.Revision == unknownRevision {
		fmt.Fprintln(c.stdout, "  revision unknown: built without VCS information (GOFLAGS=-buildvcs=false, go run, or no .git in the build, as in Docker)")
		fmt.Fprintln(c.stdout, `  build with go build in a git checkout, or stamp it: go build -ldflags "-X main.revision=$(git rev-parse HEAD)" ./cmd/marconi`+
			" (Docker: --build-arg REVISION=$(git rev-parse HEAD))")
	}
	return nil
}

// config is `marconi config [check] [flags]`: print every setting's
// effective value and where it came from (secrets masked), or, with check,
// validate the configuration and, with a database URL, reach the store.
func (c cli) config(ctx context.Context, args []string) error {
	check := len(args) > 0 && args[0] == "check"
	if len(args) > 0 && !check && closest(args[0], []string{"check"}) != "" {
		return usagef("unknown config command %q (did you mean \"check\"?); usage: marconi config [check] [flags]", args[0])
	}
	cmd := "config"
	if check {
		args, cmd = args[1:], "config check"
	}
	cfg, err := c.loadConfig(cmd, args)
	if err != nil {
		return err
	}
	if !check {
		effective := c.effectiveDefaults(cfg)
		for _, r := range cfg.resolved {
			v := r.value
			if v == "" && effective[r.env] != "" {
				fmt.Fprintf(c.stdout, "%s=\t# %s: %s\n", r.env, r.source, effective[r.env])
				continue
			}
			switch {
			case r.env == "MARCONI_API_KEYS" && v == "" && cfg.generatedAPIKey != "":
				v = "(development: generated or reused at start)"
			case r.env == "MARCONI_ADMIN_TOKEN" && v == "" && cfg.generatedAdminToken != "":
				v = "(development: generated or reused at start)"
			case r.visibility == secret:
				v = mask(r.env, v)
			}
			fmt.Fprintf(c.stdout, "%s=%s\t# %s\n", r.env, v, r.source)
		}
		fmt.Fprintf(c.stdout, "# effective: self-heal %v, public URL %s\n", cfg.Hub.SelfHeal.Enabled, cfg.Hub.PublicURL)
		return nil
	}
	return c.configCheck(ctx, cfg)
}

// mask hides a secret but keeps what helps to recognize it: the tenant and
// project of each API key, the host and database of a URL.
func mask(env, v string) string {
	if v == "" {
		return ""
	}
	switch env {
	case "MARCONI_API_KEYS":
		var out []string
		for _, item := range strings.Split(v, ",") {
			if _, owner, ok := strings.Cut(strings.TrimSpace(item), "="); ok {
				out = append(out, "****="+owner)
			}
		}
		return strings.Join(out, ",")
	case "MARCONI_DATABASE_URL":
		if !migrations.IsURL(v) {
			return maskKeywordValue(v)
		}
		u, err := url.Parse(v)
		if err != nil {
			return "****"
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "****")
		}
		if u.RawQuery != "" { // pgx takes password= and sslpassword= there too
			params := strings.Split(u.RawQuery, "&")
			for i, p := range params {
				raw, _, _ := strings.Cut(p, "=")
				k, err := url.QueryUnescape(raw)
				if err != nil {
					return "****"
				}
				if passwordKeys[k] {
					params[i] = raw + "=" + maskedPassword
				}
			}
			u.RawQuery = strings.Join(params, "&")
		}
		return u.Redacted()
	}
	return "****"
}

// maskedPassword stands for a password in a masked database URL, as
// url.URL.Redacted writes it.
const maskedPassword = "xxxxx"

// passwordKeys are a database URL's keys whose values are secret.
var passwordKeys = map[string]bool{"password": true, "sslpassword": true}

// connSpace is what separates a keyword/value string's settings.
const connSpace = " \t\n\r\v\f"

// maskKeywordValue masks the password and sslpassword values of a
// keyword/value connection string (host=… password=…), read as pgx reads
// it, and keeps the rest as written; a string it cannot read is masked
// whole.
func maskKeywordValue(s string) string {
	var out strings.Builder
	for {
		rest := strings.TrimLeft(s, connSpace)
		out.WriteString(s[:len(s)-len(rest)])
		if rest == "" {
			return out.String()
		}
		eq := strings.IndexByte(rest, '=')
		if eq < 0 {
			return "****"
		}
		key := strings.Trim(rest[:eq], connSpace)
		if key == "" || strings.ContainsAny(key, connSpace) {
			return "****"
		}
		out.WriteString(rest[:eq+1])
		s = rest[eq+1:]
		rest = strings.TrimLeft(s, connSpace)
		out.WriteString(s[:len(s)-len(rest)])
		n, ok := connValueLen(rest)
		if !ok {
			return "****"
		}
		switch {
		case passwordKeys[key] && strings.HasPrefix(rest, "'"):
			out.WriteString("'" + maskedPassword + "'") // a quote ends a value as a space does
		case passwordKeys[key]:
			out.WriteString(maskedPassword)
		default:
			out.WriteString(rest[:n])
		}
		s = rest[n:]
	}
}

// connValueLen is the length of the value that opens s in a keyword/value
// string: a quoted one with its quotes, else a run up to a space; a
// backslash escapes the byte after it. ok is false for an unclosed quote.
func connValueLen(s string) (n int, ok bool) {
	if s != "" && s[0] == '\'' {
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case '\'':
				return i + 1, true
			}
		}
		return 0, false
	}
	for n < len(s) && !strings.ContainsRune(connSpace, rune(s[n])) {
		if s[n] == '\\' {
			n++
		}
		n++
	}
	return min(n, len(s)), true
}

// notSettings are MARCONI_* prefixes read by something other than the hub
// (tests, the benchmark), never warned about.
var notSettings = []string{"MARCONI_TEST_", "MARCONI_BENCH_"}

// unknownVariable is a MARCONI_* variable that no setting reads.
type unknownVariable struct {
	name    string
	nearest string // the closest setting's name, when one is near; else ""
	typo    bool   // one edit away from nearest: surely a misspelling
}

func (u unknownVariable) String() string {
	if u.nearest == "" {
		return fmt.Sprintf("unknown variable %s is ignored", u.name)
	}
	return fmt.Sprintf("unknown variable %s is ignored (did you mean %s?)", u.name, u.nearest)
}

// unknownVariables returns each MARCONI_* variable in environ that no
// setting reads, sorted by name, with the closest known name when one is near.
func unknownVariables(environ []string) []unknownVariable {
	var c Config
	known := map[string]bool{}
	var names []string
	for _, s := range settings(&c) {
		known[s.env] = true
		names = append(names, s.env)
	}
	for _, s := range mcpSettings { // read by `marconi mcp`, not a typo of the hub's
		known[s.env] = true
	}
	var out []unknownVariable
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "MARCONI_") || known[name] || hasAnyPrefix(name, notSettings) {
			continue
		}
		u := unknownVariable{name: name, nearest: closest(name, names)}
		u.typo = u.nearest != "" && editDistance(name, u.nearest) == 1
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// closest returns the candidate nearest to s by edit distance when it is
// near enough to be a likely typo (at most a third of its length), else "".
func closest(s string, candidates []string) string {
	best, bestD := "", len(s)/3+1
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the number of single-letter edits (insertions,
// deletions, substitutions and swaps of two neighbours) from a to b: the
// optimal string alignment distance, so "mdoe" is one edit from "mode".
func editDistance(a, b string) int {
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// parseInterleaved parses fs's flags wherever they stand among the
// positional arguments (`migrate down 2 --yes` as `migrate down --yes 2`),
// and returns the positional arguments in order. On an error, those read so
// far are returned with it (so -h knows which subcommand it was asked of).
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return positional, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// flagError adds a did-you-mean to an unknown flag's error when one of fs's
// flags is near it.
func flagError(fs *flag.FlagSet, err error) error {
	const prefix = "flag provided but not defined: -"
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return err
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if s := closest(strings.TrimLeft(strings.TrimPrefix(msg, prefix), "-"), names); s != "" {
		return fmt.Errorf("%w (did you mean --%s?)", err, s)
	}
	return err
}

// effectiveDefaults are what the settings left empty resolve to, for
// `marconi config`: the variable's row says it beside its source.
func (c cli) effectiveDefaults(cfg Config) map[string]string {
	eff := map[string]string{"MARCONI_INSTANCE_ID": cfg.Hub.InstanceID, "MARCONI_PUBLIC_URL": cfg.Hub.PublicURL}
	if cfg.Hub.SelfHeal.Enabled {
		eff["MARCONI_SELFHEAL"] = "on"
	} else {
		eff["MARCONI_SELFHEAL"] = "off"
	}
	if cfg.Hub.Mode == marconi.Development && (cfg.generatedAPIKey != "" || cfg.generatedAdminToken != "") {
		if path, err := defaultDevCredentialsFile(c.getenv); err == nil {
			eff["MARCONI_DEV_CREDENTIALS_FILE"] = path
		}
	}
	return eff
}
