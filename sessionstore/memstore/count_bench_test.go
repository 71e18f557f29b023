package memstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/marconihub/marconi/sessionstore"
	"github.com/marconihub/marconi/sessionstore/memstore"
)

// BenchmarkCountSessions counts, with the quota's limit of 20000, one
// project holding 20000 live sessions (full) and one holding 10, among
// 100000 sessions of 8001 projects (docs/benchmarks-history.md, "Counting a
// project's sessions").
func BenchmarkCountSessions(b *testing.B) {
	s := memstore.New()
	b.Cleanup(func() { _ = s.Close() })
	create := func(project, id string) {
		_, err := s.CreateSession(b.Context(), sessionstore.Session{
			Key:       sessionstore.Key{TenantID: "t", ProjectID: project, SessionID: id},
			TokenHash: []byte(project + "/" + id), RegisteredAt: benchT0, ExpiresAt: benchT0.Add(24 * time.Hour),
		}, benchT0)
		if err != nil {
			b.Fatal(err)
		}
	}
	for i := range 20000 {
		create("full", fmt.Sprint(i))
	}
	for i := range 80000 {
		create(fmt.Sprintf("p%d", i%8000), fmt.Sprint(i))
	}
	for _, project := range []string{"full", "p1"} {
		b.Run("project="+project, func(b *testing.B) {
			f := sessionstore.SessionFilter{TenantID: "t", ProjectID: project, Limit: 20000}
			for b.Loop() {
				if _, err := s.CountSessions(b.Context(), f, benchT0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
