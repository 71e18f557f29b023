package hub_test

import (
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// TestNewRefusesABadConfig: a Config the hub cannot run with is refused by
// New with an error naming the field, rather than failing later at a
// request; zero fields take their defaults (the hub's or its packages').
func TestNewRefusesABadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  hub.Config
		want string
	}{
		{"unknown mode", hub.Config{Mode: "staging"}, "Mode"},
		{"negative session TTL", hub.Config{SessionTTL: -time.Second}, "SessionTTL"},
		{"negative store timeout", hub.Config{StoreTimeout: -time.Second}, "StoreTimeout"},
		{"negative prune interval", hub.Config{Retention: hub.Retention{Every: -time.Minute}}, "Retention"},
		{"negative ping interval (conns)", hub.Config{WSPingInterval: -time.Second}, "PingInterval"},
		{"negative session quota (sessions)", hub.Config{QuotaSessionsPerProject: -1}, "quota"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := hub.New(tt.cfg, hub.Deps{Store: memstore.New()})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("hub.New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
			}
		})
	}
	if _, err := hub.New(hub.Config{}, hub.Deps{Store: memstore.New()}); err != nil {
		t.Fatalf("hub.New(zero Config) = %v, want every default", err)
	}
}
