package consumer

import (
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/deadletters"
	"github.com/idemkit/idem/internal/configerr"
)

// Permanent wraps err so that the message is dead-lettered with reason
// "permanent" instead of retried (an *idem.DeadLetterError).
// Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &idem.DeadLetterError{Reason: deadletters.ReasonPermanent, Err: err}
}

// DeadLetter returns an error that dead-letters the message with the given
// reason (for instance "invalid_envelope"): an *idem.DeadLetterError.
func DeadLetter(reason string, err error) error {
	if reason == "" {
		reason = deadletters.ReasonPermanent
	}
	return &idem.DeadLetterError{Reason: reason, Err: err}
}

// ErrConfig is returned (wrapped) by New and Run for an unusable Config. It
// matches idem.ErrConfig.
var ErrConfig = configerr.New("consumer: invalid config")

func configError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}
