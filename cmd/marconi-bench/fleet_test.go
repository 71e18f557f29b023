package main

import (
	"io"
	"reflect"
	"strings"
	"testing"
)

// fleet -bus-url takes a NATS server on this machine only, and adds a run
// of three instances on it to each round of -marconi (not of -before).
func TestFleetBusURL(t *testing.T) {
	base := []string{"-database-url", "postgres://postgres@127.0.0.1:5432/f", "-haproxy-config", "../../deploy/haproxy.cfg", "-marconi", "new", "-before", "old"}
	for _, bad := range []string{"http://127.0.0.1:4222", "nats://nats.example.org:4222", "127.0.0.1:4222"} {
		_, err := parseFleetOptions(append(base, "-bus-url", bad), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-bus-url") {
			t.Errorf("-bus-url %q: err %v, want a -bus-url error", bad, err)
		}
	}
	o, err := parseFleetOptions(base, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []fleetConfig{{1, busNOTIFY}, {3, busNOTIFY}}
	if got := fleetConfigs(o, "new"); !reflect.DeepEqual(got, want) {
		t.Errorf("without -bus-url: runs %v, want %v", got, want)
	}
	o, err = parseFleetOptions(append(base, "-bus-url", "nats://127.0.0.1:4222"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := fleetConfigs(o, "old"); !reflect.DeepEqual(got, want) {
		t.Errorf("-before with -bus-url: runs %v, want %v", got, want)
	}
	want = append(want, fleetConfig{3, busNATS})
	if got := fleetConfigs(o, "new"); !reflect.DeepEqual(got, want) {
		t.Errorf("-marconi with -bus-url: runs %v, want %v", got, want)
	}
}
