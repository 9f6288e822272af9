package amqpconn

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/testkit/testbroker"
)

// A node that failed is dialled after the nodes that did not, the one that
// failed last at the very end, whatever the shuffle; the others keep being
// shuffled, so that a fleet spreads over them.
func TestNodesThatJustFailedAreDialledLast(t *testing.T) {
	t.Parallel()
	urls := []string{"amqp://a/", "amqp://b/", "amqp://c/", "amqp://d/"}
	now := time.Now()
	failedAt := map[string]time.Time{"amqp://b/": now, "amqp://a/": now.Add(-time.Second)}
	firsts := map[string]bool{}
	for range 200 {
		got := Order(urls, failedAt)
		require.ElementsMatch(t, urls, got)
		require.Equal(t, []string{"amqp://a/", "amqp://b/"}, got[2:], "failed nodes last, the latest failure at the end")
		firsts[got[0]] = true
	}
	require.Len(t, firsts, 2, "the nodes that did not fail are shuffled")
}

// A failure is forgotten after suspectFor: the node is shuffled with the
// others again.
func TestAnOldFailureIsForgotten(t *testing.T) {
	t.Parallel()
	f := &failures{at: map[string]time.Time{}}
	urls := []string{"amqp://a/", "amqp://b/"}
	now := time.Now()
	f.at["amqp://a/"] = now.Add(-2 * suspectFor)
	f.at["amqp://b/"] = now.Add(-time.Second)
	for range 20 {
		require.Equal(t, "amqp://b/", f.order(urls, now)[1])
	}
}

// silentListener accepts TCP connections and never answers, as a frozen
// broker node (kill -STOP) or a blackholed host does: the kernel completes
// the TCP handshake, nothing speaks AMQP.
func silentListener(t *testing.T) string {
	t.Helper()
	return "amqp://guest:s3cret@" + testbroker.SilentAddr(t) + "/"
}

// A node that takes the TCP connection and never answers costs one dial
// timeout, then counts as failed: the next round dials it last.
func TestASilentNodeCostsOneDialTimeoutAndIsDialledLastNext(t *testing.T) {
	t.Parallel()
	silent := silentListener(t)
	ctx := context.Background()
	_, _, _, err := DialAny(ctx, []string{silent}, amqp.Config{}, 200*time.Millisecond, nil)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
	require.Equal(t, silent, suspects.order([]string{silent, "amqp://other/"}, time.Now())[1])
}

// A refusal of the credentials ends the round: the other nodes share them.
func TestARefusalEndsTheRound(t *testing.T) {
	t.Parallel()
	refusing, other := refusingBroker(t), silentListener(t)
	urls := []string{other, refusing}
	Suspect(other) // dialled after the refusing node
	_, _, _, err := DialAny(context.Background(), urls, amqp.Config{}, 5*time.Second, nil)
	require.ErrorIs(t, err, ErrRefused)
	require.NotContains(t, err.Error(), strings.TrimPrefix(other, "amqp://guest:s3cret@"), "the silent node is not dialled")
}

// refusingBroker is the test broker's URL with a wrong password.
func refusingBroker(t *testing.T) string {
	t.Helper()
	testbroker.Dial(t) // skips, or fails under CI, without a broker
	u, err := url.Parse(testbroker.URL())
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "wrong-s3cret")
	return u.String()
}

// amqp091-go clears the socket's deadlines once the connection is open and
// arms the read deadline again only when a frame comes: a node that goes
// silent right after open-ok would hold the connection for good. DialWithin
// arms it, so the heartbeat check ends such a connection too.
func TestAConnectionSilentFromItsOpenIsNoticed(t *testing.T) {
	t.Parallel()
	testbroker.Dial(t) // skips, or fails under CI, without a broker
	p := testbroker.NewProxy(t)
	conn, _, _, err := DialAny(context.Background(), []string{p.URL()}, amqp.Config{}, 5*time.Second, nil)
	require.NoError(t, err)
	defer func() { // a close would wait for a close-ok that never comes
		p.Sever()
		_ = conn.CloseDeadline(time.Now().Add(time.Second))
	}()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	p.Stall()
	select {
	case err := <-closed:
		require.ErrorContains(t, err, "timeout")
	case <-time.After(20 * time.Second):
		t.Fatal("the silent connection was not noticed")
	}
}

// A socket that closes while the broker checks the credentials is no
// refusal: the client reports it as one (amqp.ErrCredentials), so the node
// is dialled again, and only a second refusal in a row would end the round.
func TestACutDuringTheHandshakeIsNoRefusal(t *testing.T) {
	t.Parallel()
	testbroker.Dial(t) // skips, or fails under CI, without a broker
	broker, err := url.Parse(testbroker.URL())
	require.NoError(t, err)
	proxy := handshakeCutter(t, broker.Host)
	u := *broker
	u.Host = proxy
	conn, _, _, err := DialAny(context.Background(), []string{u.String()}, amqp.Config{}, 5*time.Second, nil)
	require.NoError(t, err, "the cut is not taken for the broker's word")
	require.NoError(t, conn.Close())
}

// handshakeCutter listens on a local port and relays each connection to
// broker, except the first, which it closes once the client has sent its
// credentials (connection.start-ok): the client then reports a refusal of
// the credentials the broker never made.
func handshakeCutter(t *testing.T, broker string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for first := true; ; first = false {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go relayOrCut(client, broker, first)
		}
	}()
	return ln.Addr().String()
}

// relayOrCut relays client to broker both ways; when cut, it stops and
// closes both after the client's first frame past the protocol header.
func relayOrCut(client net.Conn, broker string, cut bool) {
	defer client.Close()
	server, err := net.DialTimeout("tcp", broker, 5*time.Second)
	if err != nil {
		return
	}
	defer server.Close()
	go func() { _, _ = io.Copy(client, server) }()
	if !cut {
		_, _ = io.Copy(server, client)
		return
	}
	header := make([]byte, 8)
	if _, err := io.ReadFull(client, header); err != nil {
		return
	}
	_, _ = server.Write(header)
	frame := make([]byte, 7) // type, channel, size: then the payload and the frame end
	if _, err := io.ReadFull(client, frame); err != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, client, int64(binary.BigEndian.Uint32(frame[3:7]))+1)
}
