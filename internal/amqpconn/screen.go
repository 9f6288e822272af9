package amqpconn

import (
	"encoding/binary"
	"net"
	"sync"
)

// Screen keeps a message the client library cannot decode from killing the
// consume connection that carries it.
//
// amqp091-go refuses a content header whose property list it cannot read
// (a header table nested deeper than 32 levels or holding more than 8,192
// entries, a field type it does not know, such as RabbitMQ's 'L') and
// closes the whole connection. RabbitMQ takes and relays all of these, and
// delivers the message again to the next connection: without the screen,
// one publisher stops the queue.
//
// The screen sits under the client, on the connection's socket (Screened),
// and reads the frames as the client will: it passes every frame on
// unchanged, except a content header the client would refuse, which it
// rewrites without the properties the client cannot read (see screenHeader:
// usually the header table alone; the message id and the body stay). It
// notes the delivery (its consumer tag and delivery tag, from the
// basic.deliver before it) as undecodable, with why; the consumer asks
// (Undecodable) for every delivery it takes and dead-letters the ones
// noted. The note is out of band: nothing a publisher writes can set it or
// clear it.
//
// What the screen reads of the stream is its framing, which the broker
// writes: where a frame could not be what the client expects (an unknown
// frame type, a frame larger than FrameMax), it steps aside for the rest of
// the connection and passes the bytes on unchanged, so that it never reads
// the stream out of step with the client; the client then fails on them as
// it would have. It holds at most one method or content-header frame, up
// to FrameMax bytes; body frames stream through. Its notes are bounded by
// the deliveries not yet taken, so by the channel's prefetch.
type Screen struct {
	mu    sync.Mutex
	notes map[delivery]*UndecodableError
}

// FrameMax is the largest frame a consume connection accepts: give it to
// the client as amqp.Config.FrameSize, so that the screen holds every frame
// the client can read.
const FrameMax = 128 << 10

// delivery names a delivery on the consume connection.
type delivery struct {
	consumerTag string
	tag         uint64
}

// NewScreen returns a screen for one connection.
func NewScreen() *Screen { return &Screen{notes: map[delivery]*UndecodableError{}} }

// Undecodable reports, once, whether the delivery of consumerTag and
// deliveryTag was rewritten because the client could not decode it, and
// why.
func (s *Screen) Undecodable(consumerTag string, deliveryTag uint64) (*UndecodableError, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := delivery{consumerTag, deliveryTag}
	why, ok := s.notes[k]
	delete(s.notes, k)
	return why, ok
}

func (s *Screen) note(k delivery, why *UndecodableError) {
	s.mu.Lock()
	s.notes[k] = why
	s.mu.Unlock()
}

// Screened returns c with what the client reads from it screened by s.
func Screened(c net.Conn, s *Screen) net.Conn {
	return &screenedConn{Conn: c, f: newFilter(s), buf: make([]byte, 32<<10)}
}

// screenedConn hands the client what its filter lets through.
type screenedConn struct {
	net.Conn
	f   *filter
	buf []byte // what one read of the socket brings
	out []byte // passed by the filter, not yet read by the client
	err error  // the socket's, once out is empty
}

func (c *screenedConn) Read(p []byte) (int, error) {
	for len(c.out) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		if n := c.f.passing(len(p)); n > 0 { // a body: straight through
			n, err := c.Conn.Read(p[:n])
			c.f.passed(n)
			return n, err
		}
		n, err := c.Conn.Read(c.buf)
		c.out = c.f.feed(c.out[:0], c.buf[:n])
		c.err = err
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	return n, nil
}

// AMQP 0-9-1 frame types and the frame-end octet.
const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE
	frameHeaderLen = 7 // type, channel, size
)

// filter reads an AMQP 0-9-1 stream from the broker, from the first frame
// on (the client reads nothing before it), and passes it on. It sees the
// stream in pieces of any size and never reads it out of step: each frame
// is taken whole by its size, as the client takes it.
type filter struct {
	screen *Screen
	aside  bool // stepped aside: pass everything on unchanged
	head   [frameHeaderLen]byte
	nhead  int
	// frame holds a method or content-header frame being read: its header,
	// payload and frame end; pass counts the bytes of another frame still
	// to pass on as they come.
	frame   []byte
	need    int
	pass    int64
	scratch []byte
	// content is, per channel, the delivery whose content follows: set by
	// basic.deliver, cleared by any other method (basic.get-ok and
	// basic.return carry content that belongs to no delivery of ours).
	content map[uint16]delivery
	// lastTag is the consumer tag last seen: the same for every delivery
	// of a consumer, kept to spare a copy per delivery.
	lastTag string
}

func newFilter(s *Screen) *filter { return &filter{screen: s, content: map[uint16]delivery{}} }

// feed appends to out what the client may read of in, and returns it.
func (f *filter) feed(out, in []byte) []byte {
	for len(in) > 0 {
		switch {
		case f.aside:
			return append(out, in...)
		case f.pass > 0:
			n := int(min(f.pass, int64(len(in))))
			out, in, f.pass = append(out, in[:n]...), in[n:], f.pass-int64(n)
		case f.need > 0:
			n := min(f.need, len(in))
			f.frame, in, f.need = append(f.frame, in[:n]...), in[n:], f.need-n
			if f.need == 0 {
				out = f.frameRead(out)
			}
		default:
			n := copy(f.head[f.nhead:], in)
			f.nhead, in = f.nhead+n, in[n:]
			if f.nhead == frameHeaderLen {
				f.nhead = 0
				out = f.started(out)
			}
		}
	}
	return out
}

// passing is how many of the next bytes, at most n, pass on unread.
func (f *filter) passing(n int) int {
	if f.aside {
		return n
	}
	return int(min(f.pass, int64(n)))
}

// passed accounts n bytes that passed on unread.
func (f *filter) passed(n int) {
	if !f.aside {
		f.pass -= int64(n)
	}
}

// started decides what to do with the frame whose header was just read.
func (f *filter) started(out []byte) []byte {
	typ, size := f.head[0], int64(binary.BigEndian.Uint32(f.head[3:7]))
	switch {
	case typ != frameMethod && typ != frameHeader && typ != frameBody && typ != frameHeartbeat,
		size+frameHeaderLen+1 > FrameMax:
		f.aside = true // the client fails on it: pass on the rest as it is
	case typ == frameMethod || typ == frameHeader:
		f.frame = append(f.frame[:0], f.head[:]...)
		f.need = int(size) + 1
		return out
	default:
		f.pass = size + 1 // a body or heartbeat frame, as it comes
	}
	return append(out, f.head[:]...)
}

// frameRead passes on a whole method or content-header frame held in
// f.frame, rewriting a content header the client would refuse.
func (f *filter) frameRead(out []byte) []byte {
	frame := f.frame
	channel := binary.BigEndian.Uint16(frame[1:3])
	payload := frame[frameHeaderLen : len(frame)-1]
	if frame[0] == frameMethod {
		f.method(channel, payload)
		return append(out, frame...)
	}
	k, ok := f.content[channel]
	delete(f.content, channel) // one content header per content method
	if frame[len(frame)-1] != frameEnd {
		return append(out, frame...) // the client fails on it
	}
	screened, why := screenHeader(payload, f.scratch)
	if why == nil {
		return append(out, frame...)
	}
	f.scratch = screened[:0]
	if ok {
		f.screen.note(k, why)
	}
	out = append(out, frameHeader, frame[1], frame[2])
	out = binary.BigEndian.AppendUint32(out, uint32(len(screened)))
	return append(append(out, screened...), frameEnd)
}

// method notes which delivery the content on channel belongs to.
func (f *filter) method(channel uint16, payload []byte) {
	delete(f.content, channel)
	// basic.deliver: class 60, method 60, consumer-tag (short string),
	// delivery-tag (long long), …
	if len(payload) < 5 || binary.BigEndian.Uint32(payload) != 60<<16|60 {
		return
	}
	n := int(payload[4])
	if len(payload) < 5+n+8 {
		return // the client fails on it
	}
	if tag := payload[5 : 5+n]; string(tag) != f.lastTag {
		f.lastTag = string(tag)
	}
	f.content[channel] = delivery{consumerTag: f.lastTag, tag: binary.BigEndian.Uint64(payload[5+n:])}
}
