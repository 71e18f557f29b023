package signals

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

func TestClassifyAndDelivery(t *testing.T) {
	now := time.Date(2026, 6, 4, 12, 0, 0, 0, time.UTC)
	fresh := 300 * time.Second
	reg := now.Add(-time.Hour)
	tests := []struct {
		name       string
		seen, verb time.Time
		route      Route
		want       marconi.RouteState
		delivery   marconi.Delivery
	}{
		{"attached wins over staleness", time.Time{}, time.Time{}, Route{Attached: true}, marconi.StateAttached, marconi.DeliveryPushed},
		{"seen within the window", now.Add(-299 * time.Second), time.Time{}, Route{}, marconi.StateRouteWithoutQueue, marconi.DeliveryQueuedOffline},
		{"verb is proof of life too", time.Time{}, now.Add(-10 * time.Second), Route{}, marconi.StateRouteWithoutQueue, marconi.DeliveryQueuedOffline},
		{"exactly at the window still fresh", now.Add(-300 * time.Second), time.Time{}, Route{}, marconi.StateRouteWithoutQueue, marconi.DeliveryQueuedOffline},
		{"older than the window", now.Add(-301 * time.Second), now.Add(-400 * time.Second), Route{}, marconi.StateStale, marconi.DeliveryNotAvailableOffline},
		{"queue on an unhealthy instance is no queue", now.Add(-time.Second), time.Time{}, Route{InstanceID: "b"}, marconi.StateRouteWithoutQueue, marconi.DeliveryQueuedOffline},
		{"never seen, registered long ago", time.Time{}, time.Time{}, Route{}, marconi.StateStale, marconi.DeliveryNotAvailableOffline},
	}
	for _, tt := range tests {
		s := sessionstore.Session{RegisteredAt: reg, LastSeenAt: tt.seen, LastVerbAt: tt.verb}
		got := Classify(s, tt.route, now, fresh)
		if got != tt.want || DeliveryFor(got) != tt.delivery {
			t.Errorf("%s: Classify = %s (%s), want %s (%s)", tt.name, got, DeliveryFor(got), tt.want, tt.delivery)
		}
	}
}

func TestValidSessionID(t *testing.T) {
	for id, want := range map[string]bool{
		"alice": true, "a.b_c-1": true, "": false, "a b": false, "a/b": false,
		string(make([]byte, 129)): false, "é": false,
	} {
		if got := ValidSessionID(id); got != want {
			t.Errorf("ValidSessionID(%q) = %v, want %v", id, got, want)
		}
	}
}

// The id and kind checks accept exactly what their regular expressions do.
func FuzzIDForms(f *testing.F) {
	idRE := regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	kindRE := regexp.MustCompile(`^[A-Za-z0-9._:/-]{1,64}$`)
	for _, s := range []string{"alice", "a.b_c-1", "", ".", "..", "a b", "a/b", "x:y/z", "é", "a\x00", strings.Repeat("a", 64),
		strings.Repeat("a", 65), strings.Repeat("b", 128), strings.Repeat("b", 129), "a\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidSessionID(s), s != "." && s != ".." && idRE.MatchString(s); got != want {
			t.Errorf("ValidSessionID(%q) = %v, want %v", s, got, want)
		}
		if got, want := validKind(s), kindRE.MatchString(s); got != want {
			t.Errorf("validKind(%q) = %v, want %v", s, got, want)
		}
	})
}
