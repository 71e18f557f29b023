package conns_test

import (
	"context"
	"testing"
	"time"

	"github.com/marconihub/marconi/hub"
	"github.com/marconihub/marconi/hub/hubtest"
	"github.com/marconihub/marconi/sessionstore"
)

// A connection's proof of life (each pong) extends only the registration
// and token the connection was opened with. A session resumed or
// registered again on another instance, which this one has not heard of,
// is not the connection's to extend: its next pong closes it with the code
// the row calls for, the pending sweep off.
func TestKeepaliveTouchesOnlyItsOwnRegistration(t *testing.T) {
	bob := sessionstore.Key{TenantID: "t1", ProjectID: "p1", SessionID: "bob"}
	changes := []rowChange{
		tokenReplaced(bob),
		{"registered again", func(t *testing.T, st sessionstore.Store) {
			ctx, now := context.Background(), time.Now().UTC().Truncate(time.Microsecond)
			if err := st.DeleteSession(ctx, bob); err != nil {
				t.Fatal(err)
			}
			if _, err := st.CreateSession(ctx, sessionstore.Session{Key: bob, TokenHash: []byte("another token's hash"),
				RegisteredAt: now, ExpiresAt: now.Add(time.Hour)}, now); err != nil {
				t.Fatal(err)
			}
		}, 4410},
	}
	for _, store := range stores {
		for _, ch := range changes {
			t.Run(store+"/"+ch.name, func(t *testing.T) {
				st := openStore(t, store)
				h := hubtest.Start(t, hubtest.Options{Store: st, Config: hub.Config{PendingSweep: noSweep, WSPingInterval: 20 * time.Millisecond}})
				c := dial(t, h, register(t, h, "bob"))
				ch.change(t, st) // as another instance would, without a word to this one
				if got := closeCode(t, c); got != ch.want {
					t.Fatalf("closed with %d, want %d", got, ch.want)
				}
			})
		}
	}
}
