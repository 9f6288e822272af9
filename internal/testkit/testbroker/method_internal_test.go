package testbroker

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// frame is an AMQP frame: type, channel 0, size, payload, frame-end.
func frame(typ byte, payload ...byte) []byte {
	f := []byte{typ, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(f[3:], uint32(len(payload)))
	return append(append(f, payload...), 0xCE)
}

// method is a method frame (class, id) with arguments args.
func method(class, id uint16, args ...byte) []byte {
	return frame(1, append(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, class), id), args...)...)
}

func TestMethodWatchFindsTheFrameWhereverReadsCutIt(t *testing.T) {
	t.Parallel()
	header := []byte("AMQP\x00\x00\x09\x01")
	before := append(append(method(10, 11, 1, 2, 3), frame(8)...), method(60, 71)...) // start-ok, heartbeat, get-ok: not it
	target := method(60, 70, 0, 0)                                                    // basic.get
	stream := append(append(append([]byte{}, header...), before...), target...)
	stream = append(stream, method(60, 40)...)
	targetAt := len(header) + len(before)

	for cut := 1; cut < len(stream); cut++ { // every split in two reads
		w := &methodWatch{class: 60, method: 70, skip: len(header)}
		first, second := stream[:cut], stream[cut:]
		at, found := w.find(first)
		if cut >= targetAt+len(target) {
			require.True(t, found, "cut %d", cut)
			require.Equal(t, targetAt, at, "cut %d", cut)
			continue
		}
		require.False(t, found, "cut %d: the frame is not complete yet", cut)
		at, found = w.find(second)
		require.True(t, found, "cut %d", cut)
		require.Equal(t, max(targetAt-cut, 0), at, "cut %d: the frame starts there, or began in the first read", cut)
	}

	w := &methodWatch{class: 60, method: 70}
	_, found := w.find(append(method(60, 71), method(10, 70)...))
	require.False(t, found, "another class or method is not it")
}
