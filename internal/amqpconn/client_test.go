package amqpconn

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// The client itself as the judge of what it decodes. The screen must refuse
// exactly what amqp091-go refuses, and its reader is unexported: clientReads
// runs the real client over a pipe whose other end plays the few frames of
// a broker's that bring one delivery (connection start, tune, open, channel
// open, consume-ok, deliver), then the content header under test. It tests
// the parser against its reference, nothing of idem's behaviour with a
// broker: that is tested against RabbitMQ.

// appendFrame appends an AMQP frame of type typ on channel ch.
func appendFrame(b []byte, typ byte, ch uint16, payload []byte) []byte {
	b = append(b, typ)
	b = binary.BigEndian.AppendUint16(b, ch)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(append(b, payload...), frameEnd)
}

// appendMethod appends a method frame (class, id) with arguments args.
func appendMethod(b []byte, ch, class, id uint16, args ...byte) []byte {
	p := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, class), id)
	return appendFrame(b, frameMethod, ch, append(p, args...))
}

func shortstr(s string) []byte { return append([]byte{byte(len(s))}, s...) }

func longstr(s string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...)
}

// deliverFrames are a basic.deliver of consumerTag and tag on channel 1 and
// the content header with payload (its body must be empty).
func deliverFrames(consumerTag string, tag uint64, payload []byte) []byte {
	args := append(shortstr(consumerTag), binary.BigEndian.AppendUint64(nil, tag)...)
	args = append(append(append(args, 0), shortstr("")...), shortstr("q")...) // redelivered, exchange, routing key
	return appendFrame(appendMethod(nil, 1, 60, 60, args...), frameHeader, 1, payload)
}

// headerPayload is a content header's payload for an empty body with the
// property flags and property list props.
func headerPayload(flags uint16, props []byte) []byte {
	p := binary.BigEndian.AppendUint16(nil, 60) // class basic
	p = binary.BigEndian.AppendUint16(p, 0)     // weight
	p = binary.BigEndian.AppendUint64(p, 0)     // body size
	p = binary.BigEndian.AppendUint16(p, flags)
	return append(p, props...)
}

// clientReads reports whether amqp091-go decodes a delivery whose content
// header has payload, and what it read.
func clientReads(tb testing.TB, payload []byte) (amqp.Delivery, bool) {
	tb.Helper()
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	go playBroker(server, deliverFrames("ctag", 1, payload))
	conn, err := amqp.Open(client, amqp.Config{SASL: []amqp.Authentication{&amqp.PlainAuth{Username: "u", Password: "p"}},
		Vhost: "/", FrameSize: FrameMax})
	require.NoError(tb, err)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	require.NoError(tb, err)
	deliveries, err := ch.Consume("q", "ctag", true, false, false, false, nil)
	require.NoError(tb, err)
	select {
	case d, ok := <-deliveries:
		return d, ok
	case <-closed:
		return amqp.Delivery{}, false
	case <-time.After(10 * time.Second):
		tb.Fatal("the client neither delivered nor closed")
		return amqp.Delivery{}, false
	}
}

// playBroker answers the client's handshake, channel open and consume on
// c, then writes then, and reads whatever the client writes until c closes.
func playBroker(c net.Conn, then []byte) {
	defer func() { _, _ = io.Copy(io.Discard, c) }()
	if _, err := io.ReadFull(c, make([]byte, 8)); err != nil { // protocol header
		return
	}
	start := append(append([]byte{0, 9, 0, 0, 0, 0}, longstr("PLAIN")...), longstr("en_US")...)
	steps := []struct {
		reads int // client frames to read first
		write []byte
	}{
		{0, appendMethod(nil, 0, 10, 10, start...)},
		{1, appendMethod(nil, 0, 10, 30, 0, 0, 0, 2, 0, 0, 0, 0)}, // start-ok; tune: frame max 128 KiB, no heartbeat
		{2, appendMethod(nil, 0, 10, 41, 0)},                      // tune-ok, open; open-ok
		{1, appendMethod(nil, 1, 20, 11, 0, 0, 0, 0)},             // channel.open; open-ok
		{1, append(appendMethod(nil, 1, 60, 21, shortstr("ctag")...), then...)},
	}
	for _, s := range steps {
		for range s.reads {
			if readFrame(c) != nil {
				return
			}
		}
		if _, err := c.Write(s.write); err != nil {
			return
		}
	}
}

// readFrame reads one frame from c.
func readFrame(c net.Conn) error {
	head := make([]byte, frameHeaderLen)
	if _, err := io.ReadFull(c, head); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint32(head[3:])+1))
	return err
}
