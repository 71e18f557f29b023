package signals_test

import (
	"errors"
	"testing"
	"time"

	"github.com/marconihub/marconi/signals"
)

func TestConfigWithDefaults(t *testing.T) {
	c := signals.Config{}.WithDefaults()
	if c.MaxPayloadBytes != signals.DefaultMaxPayloadBytes || c.IdempotencyWindow != signals.DefaultIdempotencyWindow ||
		c.Quotas.PendingPerRecipient != signals.DefaultQuotaPendingPerRecipient ||
		c.Quotas.PendingBytesPerProject != signals.DefaultQuotaPendingBytesPerProject {
		t.Fatalf("Config{}.WithDefaults() = %+v, want the documented defaults", c)
	}
	if set := (signals.Config{MaxPayloadBytes: 10, IdempotencyWindow: time.Minute}).WithDefaults(); set.MaxPayloadBytes != 10 || set.IdempotencyWindow != time.Minute {
		t.Fatalf("WithDefaults changed set fields: %+v", set)
	}
}

func TestNewRefusesAFieldOutOfRange(t *testing.T) {
	for name, cfg := range map[string]signals.Config{
		"MaxPayloadBytes":   {MaxPayloadBytes: -1},
		"IdempotencyWindow": {IdempotencyWindow: -time.Second},
		"DrainLimit":        {DrainLimit: -1},
	} {
		_, err := signals.New(cfg, nil, nil, nil, time.Now, nil, nil)
		if !errors.Is(err, signals.ErrInvalidConfig) {
			t.Errorf("New with %s out of range: %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := signals.New(signals.Config{}, nil, nil, nil, time.Now, nil, nil); err == nil || errors.Is(err, signals.ErrInvalidConfig) {
		t.Errorf("New without a store: %v, want a missing dependency", err)
	}
}
