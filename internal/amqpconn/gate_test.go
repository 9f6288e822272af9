package amqpconn

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestGateStopsReadingOnceHeldBytesReachTheBudget(t *testing.T) {
	g := NewGate(100)
	_, ok := g.wait(nil)
	require.True(t, ok, "nothing held: read")
	g.Take(60)
	g.read(30)
	waited, _ := waitFor(g, 10*time.Millisecond)
	require.False(t, waited, "90 of 100: read on")
	g.read(20)
	waited, _ = waitFor(g, 10*time.Millisecond)
	require.True(t, waited, "110 of 100: blocked until a settlement")
	g.Give(60)
	_, ok = waitFor(g, time.Second)
	require.True(t, ok, "room again after the settlement")
}

func TestGateLetsAMessageLargerThanTheBudgetThroughWhenNothingIsHeld(t *testing.T) {
	g := NewGate(100)
	g.read(500) // one big message being read
	waited, _ := waitFor(g, 10*time.Millisecond)
	require.False(t, waited)
	g.Take(500)
	waited, _ = waitFor(g, 10*time.Millisecond)
	require.True(t, waited, "held over budget: the next message waits")
	g.Give(500)
	_, ok := waitFor(g, time.Second)
	require.True(t, ok)
}

func TestOpenGateNeverBlocks(t *testing.T) {
	g := NewGate(10)
	g.Take(1000)
	g.Release()
	waited, ok := waitFor(g, 10*time.Millisecond)
	require.False(t, waited)
	require.True(t, ok)
}

func TestGatedConnReadReturnsWhenClosedWhileBlocked(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	g := NewGate(10)
	g.Take(100)
	c := Gated(a, g)
	done := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 8)); done <- err }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, c.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Read stayed blocked after Close")
	}
}

// waitFor runs g.wait with a bound: blocked past limit counts as waited.
func waitFor(g *Gate, limit time.Duration) (waited, ok bool) {
	stop := make(chan struct{})
	res := make(chan [2]bool, 1)
	go func() { w, o := g.wait(stop); res <- [2]bool{w, o} }()
	select {
	case r := <-res:
		return r[0], r[1]
	case <-time.After(limit):
		close(stop)
		<-res
		return true, false
	}
}
