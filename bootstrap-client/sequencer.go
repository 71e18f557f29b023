package bootstrap

// defaultSeenIDs bounds how many recent signal ids the client remembers to
// deduplicate deliveries that come again (replay after reattach, drain,
// piggyback).
const defaultSeenIDs = 4096

// sequencer decides which signals reach the handler: each id once, in seq
// order. Seq is per recipient session and strictly increasing, so a signal
// whose seq is at or below the highest delivered one was delivered (or passed
// over) already. A new registration of the session (epoch) starts seq afresh:
// the hub's numbering may start over when it lost the session. Ids are
// remembered across epochs in a bounded set.
//
// A sequencer is owned by the dispatcher goroutine; it is not safe for
// concurrent use.
type sequencer struct {
	epoch   uint64
	highest int64
	seen    idSet
}

func newSequencer(capacity int) *sequencer {
	return &sequencer{seen: newIDSet(capacity)}
}

// accept reports whether sig, received under registration epoch, is to be
// delivered, and records it as delivered when it is. Signals of an older
// epoch are refused: they belong to a registration that is gone.
func (s *sequencer) accept(epoch uint64, sig Signal) bool {
	switch {
	case epoch < s.epoch:
		return false
	case epoch > s.epoch:
		s.epoch, s.highest = epoch, 0
	}
	if sig.Seq <= s.highest || s.seen.has(sig.ID) {
		return false
	}
	s.seen.add(sig.ID)
	s.highest = sig.Seq
	return true
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
