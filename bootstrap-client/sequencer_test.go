package bootstrap

import (
	"fmt"
	"testing"
)

func sig(id string, seq int64) Signal { return Signal{ID: id, Seq: seq} }

func TestSequencerOrderAndDedupe(t *testing.T) {
	tests := []struct {
		name string
		in   []Signal
		want []string // ids delivered, in order
	}{
		{"in order", []Signal{sig("a", 1), sig("b", 2), sig("c", 3)}, []string{"a", "b", "c"}},
		{"replay after reattach", []Signal{sig("a", 1), sig("b", 2), sig("a", 1), sig("b", 2), sig("c", 3)}, []string{"a", "b", "c"}},
		{"older seq after newer is passed over", []Signal{sig("a", 1), sig("c", 3), sig("b", 2)}, []string{"a", "c"}},
		{"same id under another seq", []Signal{sig("a", 1), sig("a", 5)}, []string{"a"}},
		{"gaps are fine (acked earlier)", []Signal{sig("a", 4), sig("b", 9)}, []string{"a", "b"}},
		// The hub's store lost b and c (an asynchronous standby promoted):
		// its next signals take their seqs again, and a replay follows.
		{"seqs taken again after the store lost signals", []Signal{sig("a", 1), sig("b", 2), sig("c", 3), sig("x", 2), sig("y", 3), sig("z", 4), sig("x", 2), sig("y", 3)}, []string{"a", "b", "c", "x", "y", "z"}},
		{"a seq older than those remembered is passed over", []Signal{sig("a", 1), sig("b", 2), sig("c", 3), sig("d", 4), sig("e", 5), sig("f", 6), sig("g", 7), sig("h", 8), sig("x", 2)}, []string{"a", "b", "c", "d", "e", "f", "g", "h"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSequencer(4)
			var got []string
			for _, x := range tt.in {
				if s.accept(1, x) {
					got = append(got, x.ID)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("delivered %v, want %v", got, tt.want)
			}
		})
	}
}

func TestSequencerEpochs(t *testing.T) {
	s := newSequencer(16)
	if !s.accept(1, sig("a", 7)) {
		t.Fatal("first signal refused")
	}
	// The session was registered again: the hub numbers afresh.
	if !s.accept(2, sig("b", 1)) {
		t.Error("seq 1 of a new registration refused: seq must start over with the epoch")
	}
	if s.accept(2, sig("a", 8)) {
		t.Error("an id already delivered under the former registration was delivered again")
	}
	if s.accept(1, sig("z", 100)) {
		t.Error("a signal of the former registration was delivered after the new one began")
	}
	if s.highest != 1 || s.epoch != 2 {
		t.Errorf("state epoch=%d highest=%d, want 2 and 1", s.epoch, s.highest)
	}
}

func TestIDSetBounded(t *testing.T) {
	s := newIDSet(3)
	for _, id := range []string{"a", "b", "c", "d"} {
		s.add(id)
	}
	if s.has("a") {
		t.Error("oldest id kept beyond capacity")
	}
	for _, id := range []string{"b", "c", "d"} {
		if !s.has(id) {
			t.Errorf("recent id %q forgotten", id)
		}
	}
	s.add("c") // already present: must not evict
	if !s.has("b") {
		t.Error("adding a present id evicted another")
	}
	if len(s.ids) != 3 {
		t.Errorf("set holds %d ids, want 3", len(s.ids))
	}
}
