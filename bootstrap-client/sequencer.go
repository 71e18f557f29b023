package bootstrap

// defaultSeenIDs bounds how many recent signal ids the client remembers to
// deduplicate deliveries that come again (replay after reattach, drain,
// piggyback).
const defaultSeenIDs = 4096

// sequencer decides which signals reach the handler: each id once, in seq
// order. Seq is per recipient session and strictly increasing, so a signal
// whose seq is at or below the highest delivered one was delivered (or passed
// over) already, unless the hub's numbering went back: a store that lost its
// last signals (an asynchronous standby promoted after a failover) gives
// their seqs to the next ones. A signal whose seq names, in the recent ones
// remembered, a delivered signal of another id is such a new signal: it is
// delivered, and the order starts again from it (rewound). A new
// registration of the session (epoch) starts seq afresh: the hub's
// numbering may start over when it lost the session. Ids are remembered
// across epochs in a bounded set.
//
// A sequencer is owned by the dispatcher goroutine; it is not safe for
// concurrent use.
type sequencer struct {
	epoch   uint64
	highest int64
	seen    idSet
	// bySeq holds the id delivered at each of the recent seqs, at
	// seq mod its length.
	bySeq []seqID
	// rewound is set by an accept that delivered a signal below the
	// highest: the hub's numbering went back.
	rewound bool
}

// seqID is the id of the signal delivered at seq under epoch.
type seqID struct {
	epoch uint64
	seq   int64
	id    string
}

func newSequencer(capacity int) *sequencer {
	return &sequencer{seen: newIDSet(capacity), bySeq: make([]seqID, capacity)}
}

// accept reports whether sig, received under registration epoch, is to be
// delivered, and records it as delivered when it is. Signals of an older
// epoch are refused: they belong to a registration that is gone.
func (s *sequencer) accept(epoch uint64, sig Signal) bool {
	s.rewound = false
	switch {
	case epoch < s.epoch:
		return false
	case epoch > s.epoch:
		s.epoch, s.highest = epoch, 0
	}
	if s.seen.has(sig.ID) {
		return false
	}
	if sig.Seq <= s.highest {
		at := s.slot(sig.Seq)
		if at.epoch != epoch || at.seq != sig.Seq || at.id == sig.ID {
			return false // delivered, or too old to tell: passed over
		}
		s.rewound = true
	}
	s.seen.add(sig.ID)
	*s.slot(sig.Seq) = seqID{epoch: epoch, seq: sig.Seq, id: sig.ID}
	s.highest = sig.Seq
	return true
}

// rebase forgets the highest seq delivered: the hub's store moved to
// another history, whose seqs may name other signals than those delivered
// at them, so from here only ids tell a signal delivered (history.go).
func (s *sequencer) rebase() { s.highest = 0 }

// slot is where bySeq keeps seq's id.
func (s *sequencer) slot(seq int64) *seqID {
	n := int64(len(s.bySeq))
	return &s.bySeq[(seq%n+n)%n]
}

// idSet is a set of the most recent ids, bounded: adding beyond capacity
// forgets the oldest.
type idSet struct {
	ids  map[string]struct{}
	ring []string
	next int
}

func newIDSet(capacity int) idSet {
	return idSet{ids: make(map[string]struct{}, capacity), ring: make([]string, capacity)}
}

func (s *idSet) has(id string) bool {
	_, ok := s.ids[id]
	return ok
}

func (s *idSet) add(id string) {
	if s.has(id) {
		return
	}
	if old := s.ring[s.next]; old != "" {
		delete(s.ids, old)
	}
	s.ring[s.next] = id
	s.ids[id] = struct{}{}
	s.next = (s.next + 1) % len(s.ring)
}
