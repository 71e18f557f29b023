package pgstore

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestWitnessCountsWritesAndUnavailability: what a statement's outcome
// says of the store. Only an accepted write is a write (a read, even one
// that a standby answers, proves nothing of writability); only a failure
// that finds the store unavailable is a failure (a read-only refusal
// among them); a conflict, a bad value or a caller that gave up is
// neither.
func TestWitnessCountsWritesAndUnavailability(t *testing.T) {
	for _, tt := range []struct {
		name            string
		tag             string
		err             error
		write, failures bool
	}{
		{name: "insert", tag: "INSERT 0 1", write: true},
		{name: "update of no row", tag: "UPDATE 0", write: true},
		{name: "delete", tag: "DELETE 3", write: true},
		{name: "select", tag: "SELECT 1"},
		{name: "show", tag: "SHOW"},
		{name: "commit", tag: "COMMIT"},
		{name: "connection lost", err: fmt.Errorf("read: %w", io.ErrUnexpectedEOF), failures: true},
		{name: "read-only refusal", err: &pgconn.PgError{Code: codeReadOnly}, failures: true},
		{name: "unique violation", err: &pgconn.PgError{Code: codeUniqueViolation}},
		{name: "caller gave up", err: fmt.Errorf("query: %w", context.Canceled)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := &witness{}
			w.saw(pgconn.NewCommandTag(tt.tag), tt.err)
			s := &Store{witness: w}
			since, failures := s.Witness()
			if wrote := since >= 0; wrote != tt.write || (failures > 0) != tt.failures {
				t.Fatalf("write %v, failures %d; want write %v, failures %v", wrote, failures, tt.write, tt.failures)
			}
		})
	}
}

// TestWitnessWriteThenFailureIsNoWrite: a failure after the last write
// withdraws it until another write is accepted.
func TestWitnessWriteThenFailureIsNoWrite(t *testing.T) {
	w := &witness{}
	s := &Store{witness: w}
	w.saw(pgconn.NewCommandTag("INSERT 0 1"), nil)
	w.saw(pgconn.CommandTag{}, io.EOF)
	if since, failures := s.Witness(); since >= 0 || failures != 1 {
		t.Fatalf("after a write then a failure: since %v, failures %d; want no write, 1", since, failures)
	}
	w.saw(pgconn.NewCommandTag("UPDATE 1"), nil)
	if since, failures := s.Witness(); since < 0 || failures != 1 {
		t.Fatalf("after another write: since %v, failures %d; want a write, 1", since, failures)
	}
}
