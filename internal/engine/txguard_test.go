package engine

import "testing"

func TestWriteKeysBelongToOneBatchUntilItEnds(t *testing.T) {
	k := newWriteKeys()
	a, b := &batch{}, &batch{}
	if !k.take(a, 1, false) || !k.take(a, 1, false) {
		t.Fatal("a batch may take its own key again")
	}
	if k.take(b, 1, false) {
		t.Fatal("another batch's key was taken")
	}
	k.release(b, []uint64{1}) // not b's: stays a's
	if k.take(b, 1, false) {
		t.Fatal("released by a batch that did not own it")
	}
	k.release(a, []uint64{1})
	if !k.take(b, 1, false) {
		t.Fatal("a's key not free after a ended")
	}
	k.abandon(b)
	if n := k.held(); n != 0 {
		t.Fatalf("%d keys left after the last holder was abandoned", n)
	}
}

// A batch that writes a row another batch holds (its message could not be
// postponed) holds it too, after the other's lock: a third batch must not
// find the row free once the first ends, or it waits on the second's lock
// and takes the wait for another process's.
func TestWriteKeysStayHeldUntilEveryBatchThatWroteTheRowEnded(t *testing.T) {
	k := newWriteKeys()
	a, b, c := &batch{}, &batch{}, &batch{}
	k.take(a, 1, false)
	if k.take(b, 1, true) {
		t.Fatal("b wrote a's row: not alone")
	}
	k.release(a, []uint64{1})
	if k.take(c, 1, false) {
		t.Fatal("the row was free while b still held its lock")
	}
	if !k.take(b, 1, false) {
		t.Fatal("b holds the row alone once a ended")
	}
	k.release(b, []uint64{1})
	if !k.take(c, 1, false) {
		t.Fatal("the row stayed held after every holder ended")
	}
}

// An abandoned batch's keys are released for good: whatever its handler
// still writes is not recorded, even when it raced with the abandonment.
func TestAnAbandonedBatchTakesNoKeys(t *testing.T) {
	k := newWriteKeys()
	a, b := &batch{}, &batch{}
	k.take(a, 1, false)
	k.take(b, 1, true)
	k.abandon(a)
	if !k.take(a, 2, false) {
		t.Fatal("an abandoned batch's write must not be postponed")
	}
	if k.held() != 1 || !k.take(b, 1, false) {
		t.Fatal("the abandoned batch still holds keys")
	}
}
