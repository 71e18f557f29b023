package hub

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// waitDone waits for ctx to end, failing the test after a generous bound.
func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the context never ended")
	}
}

type ctxKey struct{}

// A storeContext ends as context.WithDeadline(parent, now+timeout) does:
// at the deadline, with the parent, or when released, and says why.
func TestStoreContext(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		ctx := newStoreContext(context.Background(), 20*time.Millisecond)
		defer ctx.release()
		if err := ctx.Err(); err != nil {
			t.Fatalf("Err before the deadline = %v", err)
		}
		waitDone(t, ctx)
		if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err after the deadline = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("deadline without Done", func(t *testing.T) {
		ctx := newStoreContext(context.Background(), 20*time.Millisecond)
		defer ctx.release()
		limit := time.Now().Add(10 * time.Second)
		for ctx.Err() == nil && time.Now().Before(limit) {
			time.Sleep(time.Millisecond)
		}
		if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err = %v, want DeadlineExceeded", err)
		}
	})
	t.Run("parent ends", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		ctx := newStoreContext(parent, time.Hour)
		defer ctx.release()
		done := ctx.Done()
		cancel()
		<-done
		if err := ctx.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err = %v, want Canceled", err)
		}
	})
	t.Run("parent ended before", func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		cancel()
		ctx := newStoreContext(parent, time.Hour)
		defer ctx.release()
		if err := ctx.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err = %v, want Canceled", err)
		}
		waitDone(t, ctx)
	})
	t.Run("released", func(t *testing.T) {
		ctx := newStoreContext(context.Background(), time.Hour)
		ctx.release()
		if err := ctx.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err after release = %v, want Canceled", err)
		}
		waitDone(t, ctx)
	})
	t.Run("released after Done", func(t *testing.T) {
		ctx := newStoreContext(context.Background(), time.Hour)
		done := ctx.Done()
		ctx.release()
		<-done
	})
	t.Run("rearm", func(t *testing.T) {
		ctx := newStoreContext(context.Background(), -time.Second)
		defer ctx.release()
		if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err past the deadline = %v", err)
		}
		if !ctx.rearm(time.Hour) {
			t.Fatal("rearm refused before Done was asked for")
		}
		if err := ctx.Err(); err != nil {
			t.Fatalf("Err after rearm = %v, want nil", err)
		}
		if d, _ := ctx.Deadline(); time.Until(d) < 30*time.Minute {
			t.Fatalf("Deadline after rearm(1h) = %v", d)
		}
		ctx.Done()
		if ctx.rearm(time.Hour) {
			t.Fatal("rearm moved a deadline whose timer runs")
		}
		ctx.release()
		if ctx.rearm(time.Hour) {
			t.Fatal("rearm after release")
		}
	})
	t.Run("deadline and value", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "v"), time.Minute)
		defer cancel()
		pd, _ := parent.Deadline()
		ctx := newStoreContext(parent, time.Hour)
		defer ctx.release()
		if d, ok := ctx.Deadline(); !ok || !d.Equal(pd) {
			t.Fatalf("Deadline = %v %v, want the parent's earlier %v", d, ok, pd)
		}
		short := newStoreContext(parent, time.Second)
		defer short.release()
		if d, ok := short.Deadline(); !ok || !d.Before(pd) {
			t.Fatalf("Deadline = %v %v, want its own, before %v", d, ok, pd)
		}
		if v := ctx.Value(ctxKey{}); v != "v" {
			t.Fatalf("Value = %v, want the parent's", v)
		}
	})
	t.Run("derived without a goroutine", func(t *testing.T) {
		// A store derives its query timeout from the request's context; each
		// such child must follow ctx through AfterFunc, not a goroutine.
		ctx := newStoreContext(context.Background(), time.Hour)
		before := runtime.NumGoroutine()
		var cancels []context.CancelFunc
		for range 100 {
			_, cancel := context.WithTimeout(ctx, time.Hour)
			cancels = append(cancels, cancel)
		}
		grew := runtime.NumGoroutine() - before
		for _, cancel := range cancels {
			cancel()
		}
		if grew >= 50 {
			t.Fatalf("100 contexts derived from a store context started %d goroutines", grew)
		}
		child, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		ctx.release()
		waitDone(t, child)
		if !errors.Is(child.Err(), context.Canceled) {
			t.Fatalf("child Err = %v after release, want Canceled", child.Err())
		}
	})
}
