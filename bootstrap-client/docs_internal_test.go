package bootstrap

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestConfigDefaultsAreDocumented holds docs/client.md's Config table to the
// client's defaults: each field with a default has it in its row.
func TestConfigDefaultsAreDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "client.md"))
	if err != nil {
		t.Fatal(err)
	}
	// dur spells a duration as the table does: 1m, not 1m0s.
	dur := func(d time.Duration) string {
		s := d.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		return s
	}
	for field, def := range map[string]string{
		"ReconnectBaseDelay":       dur(defaultReconnectBaseDelay),
		"ReconnectMaxDelay":        dur(defaultReconnectMaxDelay),
		"ReconnectRestartMaxDelay": dur(defaultReconnectRestartMaxDelay),
		"SendAttempts":             strconv.Itoa(defaultSendAttempts),
		"PingInterval":             dur(defaultPingInterval),
		"PingTimeout":              dur(defaultPingTimeout),
		"RateLimitWait":            dur(defaultRateLimitWait),
		"HolderHints":              strconv.Itoa(defaultHolderHints),
		"HolderRetryAfter":         dur(defaultHolderRetryAfter),
		"AckInterval":              dur(defaultAckInterval),
		"IdleConnsPerHost":         strconv.Itoa(defaultIdleConnsPerHost),
	} {
		row := regexp.MustCompile("(?m)^\\| `" + field + "` \\|.*$").Find(doc)
		if row == nil {
			t.Errorf("docs/client.md has no row for Config.%s", field)
			continue
		}
		if !strings.Contains(string(row), "default **"+def+"**") {
			t.Errorf("docs/client.md does not give Config.%s its default **%s**: %s", field, def, row)
		}
	}
}
