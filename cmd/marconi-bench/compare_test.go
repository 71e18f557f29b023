package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseCompareBounds(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{nil, ""},
		{[]string{"-idle", "10000", "-sends", "10000", "-rounds", "10"}, ""},
		{[]string{"-idle", "10001"}, "-idle"},
		{[]string{"-idle", "0"}, "-idle"},
		{[]string{"-sends", "0"}, "-sends"},
		{[]string{"-rounds", "11"}, "-rounds"},
		{[]string{"-settle", "2m"}, "-settle"},
	} {
		_, err := parseCompare(tc.args, io.Discard)
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%v: error %v, want one naming %q", tc.args, err, tc.wantErr)
		}
	}
}

// The floor pushes what is posted to /send to the named connection, and
// refuses to listen anywhere but on loopback.
func TestFloorPushesWhatIsSent(t *testing.T) {
	if err := floor(context.Background(), []string{"-addr", "10.1.2.3:0"}, io.Discard); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("floor on a non-loopback address: %v", err)
	}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- floor(ctx, []string{"-addr", addr}, io.Discard) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("floor: %v", err)
		}
	}()
	f := &floorServer{url: "http://" + addr}
	var ready error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ready = f.receiverReady(ctx); ready == nil {
			break
		}
	}
	if ready != nil {
		t.Fatalf("floor never served: %v", ready)
	}
	got := make(chan time.Time, 1)
	if err := f.receiver(ctx, got); err != nil {
		t.Fatal(err)
	}
	lat, err := sendRound(ctx, f, got, 5)
	if err != nil || len(lat) != 5 {
		t.Fatalf("5 sends: %v %v", lat, err)
	}
	clients.close()
}

func TestParseStormBounds(t *testing.T) {
	const db = "postgres://postgres@127.0.0.1:5432/x?sslmode=disable"
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"-database", db}, ""},
		{[]string{"-database", db, "-sessions", "10000", "-signals", "100000"}, ""},
		{nil, "-database"},
		{[]string{"-database", "mysql://127.0.0.1/x"}, "-database"},
		{[]string{"-database", "postgres://db.example.com/x"}, "loopback"},
		{[]string{"-database", db, "-sessions", "10001"}, "-sessions"},
		{[]string{"-database", db, "-signals", "0"}, "-signals"},
	} {
		_, err := parseStorm(tc.args, io.Discard)
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%v: error %v, want one naming %q", tc.args, err, tc.wantErr)
		}
	}
}
