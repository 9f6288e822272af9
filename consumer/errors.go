package consumer

import (
	"errors"
	"fmt"

	"github.com/idemkit/idem/deadletters"
)

// DeadLetterError marks a handler error that must not be retried: the
// message is dead-lettered with Reason. Create it with Permanent or
// DeadLetter. The runtime's own reasons are in package deadletters.
type DeadLetterError struct {
	// Reason is a short snake_case word stored with the dead letter.
	Reason string
	// Err is the cause; its text is stored with the dead letter.
	Err error
}

func (e *DeadLetterError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

func (e *DeadLetterError) Unwrap() error { return e.Err }

// Permanent wraps err so that the message is dead-lettered with reason
// "permanent" instead of retried. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &DeadLetterError{Reason: deadletters.ReasonPermanent, Err: err}
}

// DeadLetter returns an error that dead-letters the message with the given
// reason (for instance "invalid_envelope").
func DeadLetter(reason string, err error) error {
	if reason == "" {
		reason = deadletters.ReasonPermanent
	}
	return &DeadLetterError{Reason: reason, Err: err}
}

// deadLetterReason reports whether err asks for a dead letter, and why.
func deadLetterReason(err error) (string, bool) {
	if dl, ok := errors.AsType[*DeadLetterError](err); ok {
		return dl.Reason, true
	}
	return "", false
}

// ErrConfig is returned (wrapped) by New and Run for an unusable Config.
var ErrConfig = errors.New("consumer: invalid config")

func configError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// PanicError is the error a recovered handler panic becomes. The message is
// retried like after any other transient error.
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }
