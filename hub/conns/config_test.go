package conns_test

import (
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub/conns"
)

// validConfig sets every field conns.Config documents as required.
func validConfig() conns.Config {
	return conns.Config{
		InstanceID: "i1", SessionTTL: time.Hour, TouchInterval: time.Second, StoreTimeout: time.Second,
		PingInterval: time.Second, ReadLimit: 1 << 10, QueueSize: 8, WriteTimeout: time.Second,
		AckInterval: time.Second, FramesPerSecond: 10, MaxConnections: 10, MaxConnectionsPerAddress: 10,
	}
}

// TestNewRefusesAConfigMissingARequiredField: each required field left zero
// is named in New's error, before any connection could fail on it.
func TestNewRefusesAConfigMissingARequiredField(t *testing.T) {
	for _, tt := range []struct {
		field string
		unset func(*conns.Config)
	}{
		{"InstanceID", func(c *conns.Config) { c.InstanceID = "" }},
		{"SessionTTL", func(c *conns.Config) { c.SessionTTL = 0 }},
		{"TouchInterval", func(c *conns.Config) { c.TouchInterval = 0 }},
		{"StoreTimeout", func(c *conns.Config) { c.StoreTimeout = 0 }},
		{"PingInterval", func(c *conns.Config) { c.PingInterval = 0 }},
		{"ReadLimit", func(c *conns.Config) { c.ReadLimit = 0 }},
		{"QueueSize", func(c *conns.Config) { c.QueueSize = 0 }},
		{"WriteTimeout", func(c *conns.Config) { c.WriteTimeout = 0 }},
		{"AckInterval", func(c *conns.Config) { c.AckInterval = -time.Second }},
		{"FramesPerSecond", func(c *conns.Config) { c.FramesPerSecond = 0 }},
		{"MaxConnections", func(c *conns.Config) { c.MaxConnections = 0 }},
		{"MaxConnectionsPerAddress", func(c *conns.Config) { c.MaxConnectionsPerAddress = 0 }},
	} {
		cfg := validConfig()
		tt.unset(&cfg)
		_, err := conns.New(cfg, conns.Deps{})
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("New without %s: %v, want an error naming it", tt.field, err)
		}
	}
	// With every field set, what is missing is a dependency, not the config.
	if _, err := conns.New(validConfig(), conns.Deps{}); err == nil || strings.Contains(err.Error(), "Config") {
		t.Errorf("New with a whole Config and no dependencies: %v, want a missing dependency", err)
	}
}
