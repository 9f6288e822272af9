package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// HashSize is the length in bytes of a Hash.
const HashSize = sha256.Size

// Hash is the SHA-256 digest of a payload. The inbox stores it next to each
// message id so that a second delivery with the same id can be told apart
// from a different payload that reuses the id.
type Hash [HashSize]byte

// HashBytes returns the SHA-256 of the raw bytes b.
func HashBytes(b []byte) Hash { return sha256.Sum256(b) }

// String returns the hash in lowercase hex.
func (h Hash) String() string { return hex.EncodeToString(h[:]) }

// Short returns the first 12 hex digits, enough to tell hashes apart in logs.
func (h Hash) Short() string { return h.String()[:12] }

// IsZero reports whether h is the zero value.
func (h Hash) IsZero() bool { return h == Hash{} }

// HashFromBytes converts a stored digest back into a Hash. It fails unless b
// has exactly HashSize bytes.
func HashFromBytes(b []byte) (Hash, error) {
	var h Hash
	if len(b) != HashSize {
		return h, fmt.Errorf("idem: hash has %d bytes, want %d", len(b), HashSize)
	}
	copy(h[:], b)
	return h, nil
}
