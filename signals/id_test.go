package signals_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/marconihub/marconi/signals"
)

// TestSignalIDsAreTimeOrdered: a signal's id is a UUIDv7, so ids made one
// after the other sort in the order they were made and land at the end of
// the store's unique index on id instead of on a random page of it.
func TestSignalIDsAreTimeOrdered(t *testing.T) {
	w := newRecipientWorld(t, -1)
	var prev string
	for i := range 100 {
		res, err := w.svc.Send(t.Context(), signals.SendRequest{Sender: w.sender, To: "bob"})
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		id, err := uuid.Parse(res.Signal.ID)
		if err != nil || id.Version() != 7 {
			t.Fatalf("send %d: id %q (%v), want a UUIDv7", i, res.Signal.ID, err)
		}
		if res.Signal.ID <= prev {
			t.Fatalf("send %d: id %s sorts before or with the previous %s", i, res.Signal.ID, prev)
		}
		prev = res.Signal.ID
	}
}
