package conns_test

import (
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub/conns"
)

// validConfig sets every field of conns.Config.
func validConfig() conns.Config {
	return conns.Config{
		InstanceID: "i1", SessionTTL: time.Hour, TouchInterval: time.Second, StoreTimeout: time.Second,
		PingInterval: time.Second, ReadLimit: 1 << 10, QueueSize: 8, WriteTimeout: time.Second,
		AckInterval: time.Second, FramesPerSecond: 10, MaxConnections: 10, MaxConnectionsPerAddress: 10,
	}
}

// TestNewRefusesAConfigMissingARequiredField: each required field left zero,
// and each defaulted one set out of range, is named in New's error, before
// any connection could fail on it.
func TestNewRefusesAConfigMissingARequiredField(t *testing.T) {
	for _, tt := range []struct {
		field string
		unset func(*conns.Config)
	}{
		{"InstanceID", func(c *conns.Config) { c.InstanceID = "" }},
		{"SessionTTL", func(c *conns.Config) { c.SessionTTL = 0 }},
		{"TouchInterval", func(c *conns.Config) { c.TouchInterval = 0 }},
		{"StoreTimeout", func(c *conns.Config) { c.StoreTimeout = 0 }},
		{"PingInterval", func(c *conns.Config) { c.PingInterval = -time.Second }},
		{"ReadLimit", func(c *conns.Config) { c.ReadLimit = -1 }},
		{"QueueSize", func(c *conns.Config) { c.QueueSize = -1 }},
		{"WriteTimeout", func(c *conns.Config) { c.WriteTimeout = -time.Second }},
		{"AckInterval", func(c *conns.Config) { c.AckInterval = -time.Second }},
		{"FramesPerSecond", func(c *conns.Config) { c.FramesPerSecond = -1 }},
		{"MaxConnections", func(c *conns.Config) { c.MaxConnections = -1 }},
		{"MaxConnectionsPerAddress", func(c *conns.Config) { c.MaxConnectionsPerAddress = -1 }},
	} {
		cfg := validConfig()
		tt.unset(&cfg)
		_, err := conns.New(cfg, conns.Deps{})
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("New without %s: %v, want an error naming it", tt.field, err)
		}
	}
	// With every field set, or only the required ones (the others take
	// their defaults), what is missing is a dependency, not the config.
	required := conns.Config{InstanceID: "i1", SessionTTL: time.Hour, TouchInterval: time.Second, StoreTimeout: time.Second}
	for _, cfg := range []conns.Config{validConfig(), required} {
		if _, err := conns.New(cfg, conns.Deps{}); err == nil || strings.Contains(err.Error(), "Config") {
			t.Errorf("New(%+v) with no dependencies: %v, want a missing dependency", cfg, err)
		}
	}
}
