package deadletters

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/amqpnames"
)

// FuzzOwnCopy reads idem's own headers (x-idem-consumer, x-idem-reason,
// x-idem-payload-hash, x-idem-message-id) as a publisher may have written
// them: a message is idem's copy exactly when it names a consumer and a
// reason as text and its payload hash is its body's, raw or canonical; the
// id is the header's text, else the message-id property, else the hash;
// and a copy the broker dead-lettered in this queue since is never idem's.
func FuzzOwnCopy(f *testing.F) {
	f.Add([]byte(`{"b":1, "a":2}`), "billing", "max_attempts", "m-1", "prop", uint8(0), uint8(0), false)
	f.Add([]byte(`{"b":1, "a":2}`), "billing", "max_attempts", "", "", uint8(1), uint8(0), true)
	f.Add([]byte("x"), "billing", "", "m-1", "prop", uint8(2), uint8(1), false)
	f.Add([]byte("x"), "", "r", "m-1", "", uint8(3), uint8(2), false)
	f.Fuzz(func(t *testing.T, body []byte, consumer, reason, id, prop string, hashKind, form uint8, upper bool) {
		raw := idem.HashBytes(body)
		canonical, cerr := idem.HashJSON(body)
		var hexHash string
		switch hashKind % 4 {
		case 0:
			hexHash = raw.String()
		case 1:
			hexHash = canonical.String() // the zero hash when the body is no JSON
		case 2:
			other := idem.HashBytes(append(bytes.Clone(body), ' '))
			hexHash = other.String()
		default:
			hexHash = id
		}
		if upper {
			hexHash = strings.ToUpper(hexHash)
		}
		h := amqp.Table{HeaderConsumer: consumer, HeaderReason: reason, HeaderPayloadHash: hexHash}
		switch form % 3 {
		case 0:
			h[HeaderMessageID] = id
		case 1:
			h[HeaderMessageID] = []byte(id) // not text: the header is ignored
		}
		d := amqp.Delivery{MessageId: prop, Body: body, Headers: h}

		decoded, derr := hex.DecodeString(hexHash)
		hashes := derr == nil && (bytes.Equal(decoded, raw[:]) || (cerr == nil && bytes.Equal(decoded, canonical[:])))
		l, own := ownCopy(d)
		if own != (consumer != "" && reason != "" && hashes) {
			t.Fatalf("%q with consumer %q, reason %q, hash %q: own %v", body, consumer, reason, hexHash, own)
		}
		if !own {
			return
		}
		wantID := prop
		if form%3 == 0 {
			wantID = id
		}
		if wantID == "" {
			wantID = "sha256:" + hex.EncodeToString(decoded)
		}
		if l.consumer != consumer || l.reason != reason || l.id != wantID || !bytes.Equal(l.hash, decoded) {
			t.Fatalf("read as %+v, want consumer %q, reason %q, id %q, hash %x", l, consumer, reason, wantID, decoded)
		}
		if got := identify(d, "q", "ops"); !got.own() || got.id != wantID {
			t.Fatalf("identify does not take its own copy: %+v", got)
		}
		if ps := l.payloadHashes(d); len(ps) != 1 || !bytes.Equal(ps[0], decoded) {
			t.Fatalf("the row of idem's copy is looked up by %x, not by its hash %x", ps, decoded)
		}
		h["x-death"] = []any{amqp.Table{"queue": "q", "reason": "rejected"}}
		if got := identify(d, "q", "ops"); got.own() || got.consumer != "ops" || got.id != prop {
			t.Fatalf("a copy the broker dead-lettered in q since is read as %+v", got)
		}
		if d, ok := amqpnames.NewestDeath(h); !ok || d.Queue != "q" {
			t.Fatalf("x-death read as %+v", d)
		}
	})
}
