package inbox

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/configerr"
)

// Sentinels for invalid claims and options. They arrive wrapped in a
// *ValidationError; branch on them with errors.Is.
var (
	// ErrEmptyConsumer: Claim.Consumer is empty.
	ErrEmptyConsumer = errors.New("inbox: empty consumer")
	// ErrInvalidConsumer: Claim.Consumer is not valid UTF-8, holds a NUL
	// byte, or is longer than Config.MaxIDBytes.
	ErrInvalidConsumer = errors.New("inbox: invalid consumer")
	// ErrEmptyMessageID: Claim.MessageID is empty.
	ErrEmptyMessageID = errors.New("inbox: empty message id")
	// ErrMessageIDTooLong: Claim.MessageID is longer than Config.MaxIDBytes.
	ErrMessageIDTooLong = errors.New("inbox: message id too long")
	// ErrInvalidMessageID: Claim.MessageID is not valid UTF-8 or holds a NUL
	// byte, which a PostgreSQL text column cannot store.
	ErrInvalidMessageID = errors.New("inbox: invalid message id")
	// ErrZeroHash: Claim.PayloadHash is the zero hash, which means it was
	// never computed.
	ErrZeroHash = errors.New("inbox: zero payload hash")
	// ErrInvalidField: Claim.BusinessKey or Claim.Source is not valid UTF-8,
	// holds a NUL byte, or is longer than Config.MaxIDBytes.
	ErrInvalidField = errors.New("inbox: invalid field")
	// ErrRetentionTooShort: CleanupOptions.OlderThan is below the
	// retention floor (CleanupOptions.Floor). It matches idem.ErrConfig.
	ErrRetentionTooShort = configerr.New("inbox: retention below the floor")
)

// ValidationError says which input was rejected and why. Err is one of the
// package's sentinels.
type ValidationError struct {
	// Index is the claim's position in ClaimBatch's input (0 for Claim).
	Index int
	// Field is the rejected field, e.g. "MessageID" or "OlderThan".
	Field string
	// Err is the sentinel: ErrEmptyMessageID, ErrMessageIDTooLong, ….
	Err error
	// Detail explains the rejection; it never repeats an oversized value.
	Detail string
}

// Error says what was rejected, where and why.
func (e *ValidationError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("%v (%s, index %d)", e.Err, e.Field, e.Index)
	}
	return fmt.Sprintf("%v (%s, index %d): %s", e.Err, e.Field, e.Index, e.Detail)
}

// Unwrap returns the sentinel, for errors.Is.
func (e *ValidationError) Unwrap() error { return e.Err }

// checkRetention refuses a retention below the floor.
func checkRetention(olderThan, floor time.Duration) error {
	if olderThan < floor {
		return &ValidationError{Field: "OlderThan", Err: ErrRetentionTooShort,
			Detail: fmt.Sprintf("%v is below the floor %v; keep rows longer than any redelivery or replay can reach", olderThan, floor)}
	}
	return nil
}
