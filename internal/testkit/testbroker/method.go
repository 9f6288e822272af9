package testbroker

import (
	"encoding/binary"

	"github.com/idemkit/idem/internal/testkit/faultproxy"
)

// DeafAtMethod makes each proxied connection go deaf (see
// faultproxy.Deafen) at the first AMQP 0-9-1 method frame (class, method)
// that side sends: when the broker sends it, the client gets it and the
// broker never sees the client's next request; when the client sends it,
// the broker never sees that frame nor anything after it. The broker's
// frames, heartbeats included, still reach the client, so the client's
// heartbeat check ends nothing.
func DeafAtMethod(side faultproxy.Side, class, method uint16) faultproxy.Option {
	return faultproxy.Deafen(side, func() func([]byte) (int, bool) {
		w := &methodWatch{class: class, method: method}
		if side == faultproxy.Client {
			w.skip = len("AMQP\x00\x00\x09\x01") // the protocol header
		}
		return w.find
	})
}

// methodWatch looks for one method frame in what one side of a connection
// sends.
type methodWatch struct {
	class, method uint16
	skip          int    // protocol header bytes still to skip
	pending       []byte // the frame not yet complete, and what follows it
}

// find reads chunk, the next bytes sent, and reports where in it the method
// frame starts once it is complete; 0 when it started in an earlier chunk.
func (w *methodWatch) find(chunk []byte) (int, bool) {
	skip := min(w.skip, len(chunk))
	w.skip -= skip
	w.pending = append(w.pending, chunk[skip:]...)
	start := len(chunk) - len(w.pending) // of pending[0] in chunk
	for len(w.pending) >= 7 {            // type, channel, size
		size := int(binary.BigEndian.Uint32(w.pending[3:7]))
		end := 7 + size + 1 // payload, frame-end
		if len(w.pending) < end {
			break
		}
		if w.pending[0] == 1 && size >= 4 && binary.BigEndian.Uint16(w.pending[7:9]) == w.class &&
			binary.BigEndian.Uint16(w.pending[9:11]) == w.method {
			return max(start, 0), true
		}
		w.pending = w.pending[end:]
		start += end
	}
	return 0, false
}
