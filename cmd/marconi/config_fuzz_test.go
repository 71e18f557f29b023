package main

import (
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// comparable returns c without what development mode generates at random,
// and without where each value came from (flag or env, by design).
func comparable(c Config) Config {
	c.resolved = nil
	if c.generatedAPIKey != "" {
		c.Hub.APIKeys, c.generatedAPIKey = nil, ""
	}
	if c.generatedAdminToken != "" {
		c.Hub.AdminToken, c.generatedAdminToken = "", ""
	}
	return c
}

// FuzzLoadConfig sets one setting to a hostile value (a name that is no
// setting picks one by its length). An error names a variable; a value
// accepted from the environment is accepted the same from its flag, and
// makes a configuration the hub starts with. Seeds: testdata/fuzz/FuzzLoadConfig.
func FuzzLoadConfig(f *testing.F) {
	all := settings(&Config{})
	f.Add("MARCONI_SEND_RATE_PER_SECOND", "200")
	f.Fuzz(func(t *testing.T, name, value string) {
		i := slices.IndexFunc(all, func(s setting) bool { return s.env == name })
		if i < 0 {
			i = len(name) % len(all)
		}
		s := all[i]
		c, err := LoadConfig(nil, env(map[string]string{s.env: value}), io.Discard)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "MARCONI_") || !strings.Contains(err.Error(), ":") {
				t.Fatalf("%s=%q: error %q names no variable", s.env, value, err)
			}
			return
		}
		if value != "" {
			fc, ferr := LoadConfig([]string{"--" + flagName(s.env) + "=" + value}, env(nil), io.Discard)
			if ferr != nil {
				t.Fatalf("%s=%q accepted from the environment, refused as --%s: %v", s.env, value, flagName(s.env), ferr)
			}
			if !reflect.DeepEqual(comparable(c), comparable(fc)) {
				t.Fatalf("%s=%q: the environment and the flag give different configurations", s.env, value)
			}
		}
		if _, err := hub.New(c.Hub, hub.Deps{Store: memstore.New(), Registry: prometheus.NewRegistry()}); err != nil {
			t.Fatalf("%s=%q accepted, but the hub does not start with it: %v", s.env, value, err)
		}
	})
}

// FuzzParseAPIKeys: MARCONI_API_KEYS either stops the hub with a message,
// or yields keys that a client can present as a bearer credential, owned by
// valid tenant and project ids, and that read back the same when written
// out again; no key is claimed by two owners.
func FuzzParseAPIKeys(f *testing.F) {
	f.Add("0123456789abcdef=t1/p1")
	f.Fuzz(func(t *testing.T, v string) {
		keys, err := parseAPIKeys(v)
		if err != nil {
			return
		}
		var items []string
		for k, tp := range keys {
			if len(k) < 16 || strings.TrimSpace(k) != k || strings.ContainsAny(k, ",=") {
				t.Fatalf("%q: accepted the key %q", v, k)
			}
			for _, r := range k {
				if r < 0x21 || r == 0x7f || r > 0x7e {
					t.Fatalf("%q: accepted the key %q, which no HTTP header carries as sent", v, k)
				}
			}
			if !idPattern(tp.TenantID) || !idPattern(tp.ProjectID) {
				t.Fatalf("%q: accepted the owner %q/%q", v, tp.TenantID, tp.ProjectID)
			}
			if n := strings.Count(","+strings.ReplaceAll(v, " ", "")+",", ","+k+"="); n > 1 {
				t.Fatalf("%q: the key %q is listed %d times and one owner won", v, k, n)
			}
			items = append(items, k+"="+tp.TenantID+"/"+tp.ProjectID)
		}
		again, err := parseAPIKeys(strings.Join(items, ","))
		if err != nil || !maps.Equal(keys, again) {
			t.Fatalf("%q: written out again as %q it reads %v, %v", v, items, again, err)
		}
	})
}

func idPattern(s string) bool {
	if len(s) < 1 || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
