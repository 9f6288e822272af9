package faultproxy_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/faultproxy"
)

// echo starts a TCP server that sends back what it reads and closes its
// side once the client closed its own; it stops when the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func dial(t *testing.T, p *faultproxy.Proxy) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.TCPConn)
}

// roundTrip sends msg through c and returns what comes back within wait.
func roundTrip(t *testing.T, c net.Conn, msg string, wait time.Duration) (string, error) {
	t.Helper()
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	return read(c, len(msg), wait)
}

// requireSilent requires that msg, sent through c, gets no answer.
func requireSilent(t *testing.T, c net.Conn, msg, why string) {
	t.Helper()
	_, err := roundTrip(t, c, msg, 300*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, why)
}

// working dials p and checks that a round trip passes.
func working(t *testing.T, p *faultproxy.Proxy) *net.TCPConn {
	t.Helper()
	c := dial(t, p)
	got, err := roundTrip(t, c, "ping", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ping", got)
	return c
}

func read(c net.Conn, n int, wait time.Duration) (string, error) {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, n)
	got, err := io.ReadFull(c, buf)
	return string(buf[:got]), err
}

func TestForwardsBothWaysAndPassesTheHalfClose(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echo(t))
	c := working(t, p)
	require.Equal(t, 1, p.Accepted())

	require.NoError(t, c.CloseWrite()) // the echo server closes on EOF
	_, err := read(c, 1, 5*time.Second)
	require.ErrorIs(t, err, io.EOF)
}

func TestSeverClosesEveryConnectionAndAcceptsNewOnes(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echo(t))
	a, b := working(t, p), working(t, p)
	p.Sever()
	for _, c := range []net.Conn{a, b} {
		_, err := read(c, 1, 5*time.Second)
		require.Error(t, err)
		require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "a severed connection ends at once: %v", err)
	}
	working(t, p)
}

func TestStallHoldsBytesOnEveryConnectionUntilResume(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echo(t))
	old := working(t, p)
	p.Stall()
	select {
	case <-p.Stalled():
	default:
		t.Fatal("Stalled is not closed after Stall")
	}
	fresh := dial(t, p)
	for _, c := range []net.Conn{old, fresh} {
		requireSilent(t, c, "held", "nothing passes while stalled, not even on a new connection")
	}

	p.Resume()
	for _, c := range []net.Conn{old, fresh} {
		got, err := read(c, len("held"), 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, "held", got, "the held bytes pass on resume")
	}
}

func TestStallBlocksAClientThatWritesMuch(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echo(t))
	c := dial(t, p)
	require.NoError(t, c.SetWriteBuffer(64<<10))
	p.Stall()
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, err := c.Write(bytes.Repeat([]byte{'x'}, 4<<20))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "a stalled proxy takes few bytes off its client")
}

func TestStallOpenFreezesOpenConnectionsOnly(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echo(t))
	old := working(t, p)
	p.StallOpen()
	requireSilent(t, old, "y", "a connection open at StallOpen stalls")
	working(t, p) // a connection opened after StallOpen passes
}

// at finds the first "!" in what one side sends.
func at() func([]byte) (int, bool) {
	return func(b []byte) (int, bool) {
		i := bytes.IndexByte(b, '!')
		return i, i >= 0
	}
}

func TestDeafenAtWhatTheClientSendsDropsItAndTheRest(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echo(t), faultproxy.Deafen(faultproxy.Client, at))
	c := dial(t, p)
	_, err := c.Write([]byte("ab!cd"))
	require.NoError(t, err)
	got, err := read(c, 5, 300*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Equal(t, "ab", got, "what came before the point passes")
	select {
	case <-p.Stalled():
	case <-time.After(5 * time.Second):
		t.Fatal("Stalled is not closed after a connection went deaf")
	}
	requireSilent(t, c, "more", "a deaf connection stays deaf")

	// The client's close still reaches the target, which closes in turn.
	require.NoError(t, c.CloseWrite())
	_, err = read(c, 1, 5*time.Second)
	require.ErrorIs(t, err, io.EOF)

	working(t, p) // each connection goes deaf on its own
}

func TestDeafenAtWhatTheTargetSendsPassesItAndDropsTheClientsNext(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echo(t), faultproxy.Deafen(faultproxy.Target, at))
	c := dial(t, p)
	got, err := roundTrip(t, c, "ab!cd", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "ab!cd", got, "what the target sends always passes")
	requireSilent(t, c, "next", "the target is deaf once it sent the point")
}
