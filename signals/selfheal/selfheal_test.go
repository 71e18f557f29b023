package selfheal

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi"
)

func TestLiveSurface(t *testing.T) {
	tests := []struct {
		surface string
		want    bool
	}{
		{"claude_code", true},
		{"headless_cc", true},
		{"headless_cx", true},
		{"console_ops", true},
		{"console_x", true},
		{"console_", false},
		{"console", false},
		{"codex", false},
		{"", false},
		{"Claude_Code", false},
		{"headless", false},
		{"headless_batch", false},
		{"xconsole_ops", false},
	}
	for _, tt := range tests {
		if got := Surface(tt.surface).Live(); got != tt.want {
			t.Errorf("Surface(%q).Live() = %v, want %v", tt.surface, got, tt.want)
		}
	}
}

func TestSurfaceValid(t *testing.T) {
	tests := []struct {
		surface string
		want    bool
	}{
		{"claude_code", true},
		{"headless_cc", true},
		{"headless_cx", true},
		{"codex", true},
		{"console_ops", true},
		{"console_a.b-c_1", true},
		{"console_" + strings.Repeat("x", 64), true},
		{"console_" + strings.Repeat("x", 65), false},
		{"console_", false},
		{"console_a b", false},
		{"console", false},
		{"", false},
		{"Claude_Code", false},
		{"headless", false},
	}
	for _, tt := range tests {
		if got := Surface(tt.surface).Valid(); got != tt.want {
			t.Errorf("Surface(%q).Valid() = %v, want %v", tt.surface, got, tt.want)
		}
	}
	if marconi.SurfaceNames != "claude_code, console_<name>, headless_cc, headless_cx, codex" {
		t.Errorf("marconi.SurfaceNames = %q", marconi.SurfaceNames)
	}
}

func TestAC9_DisabledByDefaultInLANAndCloud(t *testing.T) {
	tests := []struct {
		mode marconi.DeploymentMode
		want bool
	}{
		{"development", true},
		{"lan", false},
		{"cloud", false},
		{"", false},
		{"LAN", false},
	}
	for _, tt := range tests {
		if got := DefaultEnabled(tt.mode); got != tt.want {
			t.Errorf("DefaultEnabled(%q) = %v, want %v", tt.mode, got, tt.want)
		}
	}
	if !DefaultConfig().Enabled {
		t.Error("DefaultConfig().Enabled = false; the default mode is development, where it is on")
	}
}

func TestAC10_DefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if c.Freshness != 300*time.Second || c.SenderStaleThreshold != 600*time.Second ||
		c.MaxAttempts != 3 || c.RefillPeriod != 60*time.Second {
		t.Errorf("DefaultConfig() = %+v, want 300s / 600s / 3 / 60s", c)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mut     func(*Config)
		wantVar string
	}{
		{"freshness zero", func(c *Config) { c.Freshness = 0 }, "MARCONI_SELFHEAL_FRESHNESS_SECONDS"},
		{"sender threshold negative", func(c *Config) { c.SenderStaleThreshold = -time.Second }, "MARCONI_SELFHEAL_SENDER_STALE_THRESHOLD_SECONDS"},
		{"max attempts zero", func(c *Config) { c.MaxAttempts = 0 }, "MARCONI_SELFHEAL_MAX_ATTEMPTS_PER_SESSION"},
		{"max attempts huge", func(c *Config) { c.MaxAttempts = maxAttemptsLimit + 1 }, "MARCONI_SELFHEAL_MAX_ATTEMPTS_PER_SESSION"},
		{"refill zero", func(c *Config) { c.RefillPeriod = 0 }, "MARCONI_SELFHEAL_TOKEN_REFILL_SECONDS"},
		{"disabled still validated", func(c *Config) { c.Enabled = false; c.RefillPeriod = 0 }, "MARCONI_SELFHEAL_TOKEN_REFILL_SECONDS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mut(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.wantVar) {
				t.Errorf("Validate() = %q, want it to name %s", err, tt.wantVar)
			}
		})
	}
}

func TestAC8_OutcomeEnum(t *testing.T) {
	want := []Outcome{"attempted", "succeeded", "no_listener", "rate_limited", "stale_recency", "unsupported_surface", "failed"}
	if got := marconi.Outcomes; !slices.Equal(got, want) {
		t.Fatalf("marconi.Outcomes = %v, want %v", got, want)
	}
	consts := []Outcome{marconi.OutcomeAttempted, marconi.OutcomeSucceeded, marconi.OutcomeNoListener, marconi.OutcomeRateLimited,
		marconi.OutcomeStaleRecency, marconi.OutcomeUnsupportedSurface, marconi.OutcomeFailed}
	if !slices.Equal(consts, want) {
		t.Errorf("outcome constants = %v, want %v", consts, want)
	}
}
