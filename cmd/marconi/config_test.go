package main

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/fabric/natsbus"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestConfigDefaults(t *testing.T) {
	c, err := LoadConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || c.Hub.Mode != "development" || c.DatabaseURL != "" {
		t.Errorf("defaults: addr %q mode %q db %q", c.Addr, c.Hub.Mode, c.DatabaseURL)
	}
	h := c.Hub
	if h.SessionTTL != time.Hour || h.SelfHeal.Freshness != 300*time.Second || h.SelfHeal.SenderStaleThreshold != 600*time.Second ||
		h.SelfHeal.MaxAttempts != 3 || h.SelfHeal.RefillPeriod != time.Minute || h.Fabric.Grace != time.Minute ||
		h.Fabric.DeadAfter != 10*time.Second || h.MaxPayloadBytes != 65536 || h.WSPingInterval != 20*time.Second ||
		h.WSReadLimit != 32768 || h.SendRatePerSecond != 200 || h.Fabric.Placement.DefaultMode != "stateless" ||
		h.Fabric.DisconnectPolicy != "retain" || h.Fabric.Placement.Adaptive {
		t.Errorf("defaults differ from docs/operations.md: %+v", h)
	}
	if !h.SelfHeal.Enabled {
		t.Error("self-heal must default on in development")
	}
	if h.ReadyzCache != 500*time.Millisecond {
		t.Errorf("MARCONI_READYZ_CACHE_MS default: %v, want 500 ms (docs/operations.md)", h.ReadyzCache)
	}
	off, err := LoadConfig(nil, env(map[string]string{"MARCONI_READYZ_CACHE_MS": "0"}), io.Discard)
	if err != nil {
		t.Fatalf("MARCONI_READYZ_CACHE_MS=0: %v", err)
	}
	if off.Hub.ReadyzCache >= 0 {
		t.Errorf("MARCONI_READYZ_CACHE_MS=0: %v, want the cache off (negative)", off.Hub.ReadyzCache)
	}
	if c.generatedAPIKey == "" || c.generatedAdminToken == "" || h.AdminToken != c.generatedAdminToken {
		t.Error("development mode must generate an API key and an admin token")
	}
}

// TestAC9_SelfHealDefaultsOffInLANAndCloud pins SPEC-168 AC-9.
func TestAC9_SelfHealDefaultsOffInLANAndCloud(t *testing.T) {
	for _, mode := range []string{"lan", "cloud"} {
		c, err := LoadConfig(nil, env(map[string]string{"MARCONI_MODE": mode, "MARCONI_ADMIN_TOKEN": "0123456789abcdef"}), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.Hub.SelfHeal.Enabled {
			t.Errorf("self-heal on by default in %s", mode)
		}
		if c.generatedAPIKey != "" || c.generatedAdminToken != "" {
			t.Errorf("%s mode generated credentials", mode)
		}
	}
}

func TestSelfHealFlagAndAlias(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{"MARCONI_MODE": "lan", "PRISM_MARCONI_SELFHEAL": "true"}, true},
		{map[string]string{"MARCONI_MODE": "lan", "MARCONI_SELFHEAL": "on"}, true},
		{map[string]string{"PRISM_MARCONI_SELFHEAL": "false"}, false},
		{map[string]string{"MARCONI_SELFHEAL": "false", "PRISM_MARCONI_SELFHEAL": "true"}, false},
		{map[string]string{"MARCONI_MODE": "cloud", "MARCONI_SELFHEAL": "true", "PRISM_MARCONI_SELFHEAL": "false"}, true},
	}
	for _, tt := range tests {
		c, err := LoadConfig(nil, env(tt.env), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.Hub.SelfHeal.Enabled != tt.want {
			t.Errorf("%v: enabled = %v, want %v", tt.env, c.Hub.SelfHeal.Enabled, tt.want)
		}
	}
}

func TestConfigFlagsWinOverEnv(t *testing.T) {
	c, err := LoadConfig([]string{"--addr", "127.0.0.1:9999", "--selfheal-freshness-seconds", "42", "--selfheal=false"},
		env(map[string]string{"MARCONI_ADDR": ":1", "MARCONI_SELFHEAL_FRESHNESS_SECONDS": "7"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:9999" || c.Hub.SelfHeal.Freshness != 42*time.Second || c.Hub.SelfHeal.Enabled {
		t.Errorf("flags did not win: %q %v %v", c.Addr, c.Hub.SelfHeal.Freshness, c.Hub.SelfHeal.Enabled)
	}
	if c.Hub.PublicURL != "http://127.0.0.1:9999" {
		t.Errorf("public URL default = %q", c.Hub.PublicURL)
	}
}

func TestConfigBadValuesNameTheVariable(t *testing.T) {
	bad := map[string]string{
		"MARCONI_MODE":                              "prod",
		"MARCONI_DATABASE_URL":                      "mysql://x",
		"MARCONI_SELFHEAL":                          "maybe",
		"PRISM_MARCONI_SELFHEAL":                    "2",
		"MARCONI_SELFHEAL_FRESHNESS_SECONDS":        "-1",
		"MARCONI_SELFHEAL_MAX_ATTEMPTS_PER_SESSION": "0",
		"MARCONI_SELFHEAL_TOKEN_REFILL_SECONDS":     "soon",
		"MARCONI_SESSION_TTL_SECONDS":               "0",
		"MARCONI_RECONNECT_GRACE_SECONDS":           "1.5",
		"MARCONI_PUBLIC_URL":                        "ftp://x",
		"MARCONI_ADAPTIVE_PLACEMENT":                "maybe",
		"MARCONI_DEFAULT_RUNTIME_MODE":              "pinned",
		"MARCONI_DISCONNECT_POLICY":                 "keep",
		"MARCONI_STICKY_PLACEMENT":                  "nearest",
		"MARCONI_API_KEYS":                          "short=t/p",
		"MARCONI_ADMIN_TOKEN":                       "short",
		"MARCONI_MAX_PAYLOAD_BYTES":                 "big",
		"MARCONI_WS_PING_SECONDS":                   "0",
		"MARCONI_WS_READ_LIMIT_BYTES":               "10",
		"MARCONI_SEND_RATE_PER_SECOND":              "-5",
		"MARCONI_INSTANCE_DEAD_AFTER_SECONDS":       "2",
		"MARCONI_BUS_URL":                           "http://127.0.0.1:4222",
		"MARCONI_BUS_QUEUE_SIZE":                    "0",
		"MARCONI_STORE_BATCHES_IN_FLIGHT":           "0",
		"MARCONI_STORE_ACKS_PER_BATCH":              "-1",
		"MARCONI_STORE_QUOTA_LEASE_BYTES":           "1MiB",
		"MARCONI_RETAIN_ACKED_PAYLOAD_BYTES":        "-1",
		"MARCONI_READYZ_CACHE_MS":                   "-1",
	}
	for name, v := range bad {
		_, err := LoadConfig(nil, env(map[string]string{name: v}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: err %v, want an error naming the variable", name, v, err)
		}
	}
	// Clients append paths to the public URL and every send answer carries
	// it: a user, password, query or fragment is refused, never echoed.
	for _, v := range []string{"https://ops:hunter2@hub.example.com", "https://hub.example.com/?a=b", "https://hub.example.com/?",
		"https://hub.example.com/#top", "https://hub.example.com/#"} {
		_, err := LoadConfig(nil, env(map[string]string{"MARCONI_PUBLIC_URL": v}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "MARCONI_PUBLIC_URL") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("MARCONI_PUBLIC_URL=%q: err %v, want a refusal naming the variable and not the password", v, err)
		}
	}
	if c, err := LoadConfig(nil, env(map[string]string{"MARCONI_PUBLIC_URL": "https://lb.example.com/i/hub-1/"}), io.Discard); err != nil || c.Hub.PublicURL != "https://lb.example.com/i/hub-1" {
		t.Errorf("a public URL with a path: %q, %v", c.Hub.PublicURL, err)
	}
	if _, err := LoadConfig(nil, env(map[string]string{"MARCONI_API_KEYS": "key-aaaaaaaaaaaaaaaa=acme corp/web"}), io.Discard); err == nil {
		t.Error("a tenant id with a space was accepted; route_state could never name it")
	}
	for _, v := range []string{"key-aaaaaaaaaaaaaaaa=../web", "key-aaaaaaaaaaaaaaaa=acme/.", "key-aaaaaaaaaaaaaaaa=./.."} {
		if _, err := LoadConfig(nil, env(map[string]string{"MARCONI_API_KEYS": v}), io.Discard); err == nil || !strings.Contains(err.Error(), "not . or ..") {
			t.Errorf("MARCONI_API_KEYS=%s: err %v, want a refusal of . and .. as tenant or project", v, err)
		}
	}
	if _, err := LoadConfig(nil, env(map[string]string{"MARCONI_MODE": "lan", "MARCONI_ADMIN_TOKEN": "0123456789abcdef",
		"MARCONI_DATABASE_URL": "postgres://x@db/marconi"}), io.Discard); err == nil || !strings.Contains(err.Error(), "MARCONI_PUBLIC_URL") {
		t.Errorf("lan with Postgres and no public URL: err %v, want one naming MARCONI_PUBLIC_URL", err)
	}
	if _, err := LoadConfig(nil, env(map[string]string{"MARCONI_BUS_URL": "nats://127.0.0.1:4222"}), io.Discard); err == nil ||
		!strings.Contains(err.Error(), "MARCONI_BUS_URL: needs MARCONI_DATABASE_URL") {
		t.Errorf("a NATS bus on the embedded store: err %v, want one saying it needs MARCONI_DATABASE_URL", err)
	}
	c, err := LoadConfig(nil, env(map[string]string{"MARCONI_BUS_URL": "nats://a:4222, tls://b:4222", "MARCONI_DATABASE_URL": "postgres://x@db/marconi"}), io.Discard)
	if err != nil || c.BusURL != "nats://a:4222, tls://b:4222" || c.BusQueueSize != natsbus.DefaultQueueSize {
		t.Errorf("a NATS cluster URL list: %v, bus %q queue %d", err, c.BusURL, c.BusQueueSize)
	}
	if _, err := LoadConfig(nil, env(map[string]string{"MARCONI_STORE_BATCHES_IN_FLIGHT": "8"}), io.Discard); err == nil ||
		!strings.HasPrefix(err.Error(), "MARCONI_STORE_BATCHES_IN_FLIGHT: 8 must be below MARCONI_DATABASE_MAX_CONNS (8)") {
		t.Errorf("as many batches in flight as pooled connections: err %v, want one opening with MARCONI_STORE_BATCHES_IN_FLIGHT", err)
	}
	c, err = LoadConfig(nil, env(map[string]string{"MARCONI_STORE_BATCHES_IN_FLIGHT": "3", "MARCONI_DATABASE_MAX_CONNS": "4"}), io.Discard)
	if err != nil || c.StoreBatchesInFlight != 3 {
		t.Errorf("3 batches in flight on 4 connections: %v, %d", err, c.StoreBatchesInFlight)
	}
	if _, err := LoadConfig([]string{"--no-such-flag"}, env(nil), io.Discard); err == nil {
		t.Error("an unknown flag was accepted")
	}
}

func TestParseAPIKeys(t *testing.T) {
	c, err := LoadConfig(nil, env(map[string]string{"MARCONI_API_KEYS": "key-aaaaaaaaaaaaaaaa=acme/web, key-bbbbbbbbbbbbbbbb=acme/ops"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Hub.APIKeys) != 2 || c.Hub.APIKeys["key-bbbbbbbbbbbbbbbb"].ProjectID != "ops" || c.generatedAPIKey != "" {
		t.Fatalf("keys = %+v", c.Hub.APIKeys)
	}
}

// TestBooleanFlagTakesItsValueAsTheNextWord: "--selfheal false" (two
// words) worked while the flag took a string and works still, beside
// "--selfheal=false" and a bare "--selfheal"; a word that is not a boolean
// stays an argument, and the value of another flag is never taken for one.
func TestBooleanFlagTakesItsValueAsTheNextWord(t *testing.T) {
	lan := []string{"--mode", "lan", "--admin-token", "0123456789abcdef"}
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{[]string{"--selfheal", "false"}, false},
		{[]string{"-selfheal", "off"}, false},
		{[]string{"--selfheal", "true"}, true},
		{[]string{"--selfheal=false"}, false},
		{[]string{"--selfheal"}, true},
		{[]string{"--selfheal", "no", "--addr", "127.0.0.1:0"}, false},
	} {
		c, err := LoadConfig(append(slices.Clone(tt.args), lan...), env(nil), &bytes.Buffer{})
		if err != nil || c.Hub.SelfHeal.Enabled != tt.want {
			t.Errorf("%q: self-heal %v, err %v; want %v", tt.args, c.Hub.SelfHeal.Enabled, err, tt.want)
		}
	}
	_, err := LoadConfig(append([]string{"--selfheal", "maybe"}, lan...), env(nil), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `unexpected arguments ["maybe"`) {
		t.Errorf("--selfheal maybe: %v, want the word left as an unexpected argument", err)
	}
	// "false" here is the admin token's value, not a boolean for anyone.
	if got := joinBoolValues([]string{"--admin-token", "false", "--selfheal", "0"}, map[string]*settingFlag{
		"MARCONI_ADMIN_TOKEN": {}, "MARCONI_SELFHEAL": {bool: true},
	}); !slices.Equal(got, []string{"--admin-token", "false", "--selfheal=0"}) {
		t.Errorf("joinBoolValues = %q", got)
	}
	if got := joinBoolValues([]string{"--", "--selfheal", "false"}, map[string]*settingFlag{"MARCONI_SELFHEAL": {bool: true}}); !slices.Equal(got, []string{"--", "--selfheal", "false"}) {
		t.Errorf("after --: %q", got)
	}
}
