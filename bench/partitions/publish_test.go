package main

import "testing"

// The publisher's sequence: each account's events numbered 1, 2, … in the
// order they are taken, and every duplicate taken dupDelay events after its
// first copy, so that the order check sees only what the consumer did.
func TestEventsNumberEachAccountInOrderAndRepeatSomeLater(t *testing.T) {
	s := newEvents(options{accounts: 50, dup: 0.1}, 1)
	last := map[int]int{}
	first := map[event]int{}
	dups := 0
	for i := 1; s.distinct < 5000; i++ {
		e := s.take()
		if at, seen := first[e]; seen {
			dups++
			if i-at != dupDelay {
				t.Fatalf("%v repeated %d events after its first copy, want %d", e, i-at, dupDelay)
			}
			continue
		}
		if e.seq != last[e.account]+1 {
			t.Fatalf("account %d: event %d after %d", e.account, e.seq, last[e.account])
		}
		last[e.account], first[e] = e.seq, i
	}
	dups += len(s.rest())
	if dups < 400 || dups > 600 {
		t.Fatalf("%d duplicates of 5000 events, want about 10%%", dups)
	}
}
