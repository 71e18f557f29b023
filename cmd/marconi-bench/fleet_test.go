package main

import (
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestParseFleetInstances(t *testing.T) {
	db := "postgres://postgres@127.0.0.1:5432/fleet?sslmode=disable"
	cfg := "../../deploy/haproxy.cfg"
	for _, tc := range []struct {
		arg  string
		want []int
	}{
		{"", []int{1, fleetInstances}},
		{"1", []int{1}},
		{"3", []int{fleetInstances}},
		{"1,3", []int{1, fleetInstances}},
	} {
		args := []string{"-database-url", db, "-haproxy-config", cfg}
		if tc.arg != "" {
			args = append(args, "-instances", tc.arg)
		}
		o, err := parseFleetOptions(args, io.Discard)
		if err != nil {
			t.Fatalf("-instances %q: %v", tc.arg, err)
		}
		if !reflect.DeepEqual(o.instances, tc.want) {
			t.Errorf("-instances %q: got %v, want %v", tc.arg, o.instances, tc.want)
		}
	}
	for _, bad := range []string{"2", "3,1", "0", "1,2,3", "x"} {
		_, err := parseFleetOptions([]string{"-database-url", db, "-haproxy-config", cfg, "-instances", bad}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "-instances") {
			t.Errorf("-instances %q: got %v, want an -instances error", bad, err)
		}
	}
}
