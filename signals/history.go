package signals

import (
	"context"
	"errors"
	"time"

	"github.com/marconihub/marconi"
	"github.com/marconihub/marconi/sessionstore"
)

// A store whose data went back in time (sessionstore.Historian: an
// asynchronous standby promoted) may have given the seqs of signals it lost
// to new ones. A client that drains past the seqs it saw, or acknowledges
// them, would skip or acknowledge the new ones unseen. So every answer that
// hands a client signals names the store's history they were read under (a
// token, History), a drain under another history than the store's starts
// again from the acknowledged seq (Drain), and an ack under another is
// refused (AckUnder). With a store that keeps no history the token is ""
// and nothing changes.

// History is the token of the store's current history, "" when the store
// keeps none or knows none yet. Read before a read of signals, it is the
// history they were read under, or an earlier one: a client told an
// earlier one than the store's asks again from its acknowledged seq.
func (s *Service) History() string {
	if s.hist == nil {
		return ""
	}
	_, token := s.hist.HistoryToken()
	return token
}

// ValidHistory reports whether h can be a history token: "" (none), or of
// the form of an id (IDForm), which every token the hub hands out has.
func ValidHistory(h string) bool { return h == "" || ValidSessionID(h) }

// DrainRequest is one GET /v1/signals, already authenticated.
type DrainRequest struct {
	Key      sessionstore.Key
	AfterSeq int64
	Limit    int
	// History is the token of the history the client's AfterSeq was read
	// under; "" names none.
	History string
}

// DrainResult is the answer to a drain.
type DrainResult struct {
	Signals      []sessionstore.Signal
	NextAfterSeq int64
	// History is the token of the store's history the signals were read
	// under ("" when it keeps none).
	History string
	// HistoryChanged says the request named another history than the
	// store's: the signals are read from the acknowledged seq, not after
	// AfterSeq.
	HistoryChanged bool
}

// Drain returns the caller's unacknowledged signals after req.AfterSeq, at
// most req.Limit (capped by DrainLimit), or, when req.History names another
// history than the store's, from its acknowledged seq.
func (s *Service) Drain(ctx context.Context, req DrainRequest) (DrainResult, error) {
	res := DrainResult{History: s.History()}
	after := req.AfterSeq
	if req.History != "" && res.History != "" && req.History != res.History {
		after, res.HistoryChanged = 0, true
	}
	sigs, err := s.Pending(ctx, req.Key, after, req.Limit)
	if err != nil {
		return DrainResult{}, err
	}
	res.Signals, res.NextAfterSeq = sigs, after
	if len(sigs) > 0 {
		res.NextAfterSeq = sigs[len(sigs)-1].Seq
	}
	return res, nil
}

// AckUnder acknowledges every signal of k with seq <= upToSeq, received
// under the store's history named by history. With history "" (the client
// names none), or a store that keeps none, it is Ack. Otherwise the ack
// is made as h (AckAs) and only while the store stays on that history,
// checked in the ack's own write: another history, now or before the ack
// commits, is an *marconi.Error with CodeHistoryChanged and nothing is
// acknowledged; h no longer speaking for k is CodeSessionExpired. A session
// that changed while the ack was checked is asked again once; changed again,
// the ack is an *marconi.Error with CodeRegistryUnavailable and a
// RetryAfter (a transient conflict, not a failure), wrapping the store's
// sessionstore.ErrConflict, and nothing is acknowledged.
func (s *Service) AckUnder(ctx context.Context, k sessionstore.Key, h sessionstore.Holder, upToSeq int64, history string) (int, error) {
	if history == "" || s.hist == nil {
		return s.Ack(ctx, k, upToSeq)
	}
	n, token := s.hist.HistoryToken()
	if token == "" {
		return s.Ack(ctx, k, upToSeq)
	}
	if token != history {
		return 0, historyChanged()
	}
	h.History = n
	for attempt := 1; ; attempt++ {
		acked, err := s.AckAs(ctx, k, h, upToSeq)
		switch {
		case err == nil:
			return acked, nil
		case errors.Is(err, sessionstore.ErrHistoryChanged):
			return 0, historyChanged()
		case errors.Is(err, sessionstore.ErrNotFound), errors.Is(err, sessionstore.ErrTokenMismatch):
			return 0, marconi.Errorf(marconi.CodeSessionExpired, "this session token matches no live session; register again")
		case errors.Is(err, sessionstore.ErrConflict) && attempt == 1:
			continue // the session changed while the ack was checked: once more tells how
		case errors.Is(err, sessionstore.ErrConflict):
			return 0, ackRaced(err)
		}
		return 0, err
	}
}

// ackRetryAfter is the Retry-After of an ack that lost its race twice: a
// session changing under its ack settles within moments.
const ackRetryAfter = time.Second

// ackRaced answers an ack whose session changed under it twice running
// (err, wrapping sessionstore.ErrConflict, the second time): a transient
// conflict the client retries, with the wrapped error kept for the log.
func ackRaced(err error) error {
	return errors.Join(&marconi.Error{
		Code:       marconi.CodeRegistryUnavailable,
		Message:    "the session changed twice while this ack was checked; nothing was acknowledged: try again",
		RetryAfter: ackRetryAfter,
	}, err)
}

func historyChanged() error {
	return marconi.Errorf(marconi.CodeHistoryChanged,
		"the store moved to another history (a standby promoted) since these signals were read; nothing was acknowledged: drain again and acknowledge what comes")
}
