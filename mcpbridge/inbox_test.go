package mcpbridge

import (
	"testing"

	"github.com/marconihub/marconi/bootstrap-client"
)

// Acknowledgements are cumulative, so one may only cover signals whose
// answers were all written: a later read written first waits for the
// earlier one, and an answer that never left gives its signals back.
func TestInboxAcksOnlyWhatAllAnswersReturned(t *testing.T) {
	b := newInbox(10)
	for i := int64(1); i <= 4; i++ {
		b.add(bootstrap.Signal{ID: string(rune('a' + i)), Seq: i})
	}
	first, t1, more := b.take(1)
	second, t2, _ := b.take(2)
	if len(first) != 1 || first[0].Seq != 1 || !more || len(second) != 2 || second[0].Seq != 2 {
		t.Fatalf("takes: %v %v", first, second)
	}
	if s, ok := b.commit(t2); ok {
		t.Fatalf("acked up to %d while the answer with seq 1 is unwritten", s.Seq)
	}
	if s, ok := b.commit(t1); !ok || s.Seq != 3 {
		t.Fatalf("after both answers: ack %v %v, want up to 3", s.Seq, ok)
	}
	last, t3, _ := b.take(5)
	b.abandon(t3)
	again, _, _ := b.take(5)
	if len(last) != 1 || len(again) != 1 || again[0].Seq != 4 {
		t.Fatalf("an abandoned answer's signal is not returned again: %v %v", last, again)
	}
	if _, tok, _ := b.take(5); tok != 0 {
		t.Fatal("a signal returned twice")
	}
}

// A full inbox makes the client wait (the signals stay on the hub) until a
// commit makes room, or the inbox closes.
func TestInboxBoundedAddWaits(t *testing.T) {
	b := newInbox(1)
	b.add(bootstrap.Signal{ID: "a", Seq: 1})
	added := make(chan bool)
	go func() { added <- b.add(bootstrap.Signal{ID: "b", Seq: 2}) }()
	_, tok, _ := b.take(1)
	b.commit(tok)
	if !<-added {
		t.Fatal("add refused after room was made")
	}
	go func() { added <- b.add(bootstrap.Signal{ID: "c", Seq: 3}) }()
	b.close()
	if <-added {
		t.Fatal("add into a closed full inbox succeeded")
	}
}
