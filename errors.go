package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/configerr"
)

// ErrConfig is what every configuration error of idem's packages wraps: a
// Config, options or arguments that a package cannot use (a missing Pool,
// a negative limit, a malformed broker URL, an unusable schema or prefix).
// errors.Is(err, idem.ErrConfig) holds for all of them, whichever package
// refused; packages with a sentinel of their own (consumer.ErrConfig,
// projection.ErrConfig, httpinbox.ErrConfig, retention.ErrInvalidConfig,
// replay.ErrInvalidOptions, …) match it too. Nothing was done: fix the
// configuration, do not retry.
var ErrConfig = configerr.ErrConfig

// DeadLetterError marks a handler error that must not be retried: the
// message is dead-lettered with Reason. consumer.Permanent and
// consumer.DeadLetter create it; the runtime's own reasons are in package
// deadletters.
type DeadLetterError struct {
	// Reason is a short snake_case word stored with the dead letter.
	Reason string
	// Err is the cause; its text is stored with the dead letter.
	Err error
}

// Error is the reason, then the cause.
func (e *DeadLetterError) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Reason + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *DeadLetterError) Unwrap() error { return e.Err }

// PanicError is the error a recovered handler panic becomes. The message is
// retried like after any other transient error.
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

// Error says what the handler panicked with.
func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }

// TimeoutError is the error of a handler that ran past its HandlerTimeout:
// the message's attempt failed, and after the last attempt it is
// dead-lettered with reason handler_timeout. errors.Is(err,
// context.DeadlineExceeded) holds.
type TimeoutError struct {
	// Limit is the handler timeout.
	Limit time.Duration
	// Abandoned reports that the handler ignored its context: its
	// transaction was closed under it and its goroutine left behind.
	Abandoned bool
}

// Unwrap makes errors.Is(err, context.DeadlineExceeded) hold.
func (e *TimeoutError) Unwrap() error { return context.DeadlineExceeded }

// Error says how long the handler ran and whether it was abandoned.
func (e *TimeoutError) Error() string {
	if e.Abandoned {
		return fmt.Sprintf("handler ignored its context past its %s deadline and was abandoned", e.Limit)
	}
	return fmt.Sprintf("handler ran past its %s deadline", e.Limit)
}

// ErrTransactionControl is returned to a handler that tries to end or
// restructure the batch transaction, which belongs to the runtime: its
// Commit and Rollback methods, and statements such as COMMIT, ROLLBACK,
// BEGIN, SAVEPOINT or PREPARE TRANSACTION sent through Exec, Query,
// QueryRow, SendBatch or Prepare. Nothing is sent; the message is
// dead-lettered with reason handler_ended_transaction.
var ErrTransactionControl = errors.New("the runtime owns the batch transaction: a handler must not commit, roll back or use savepoints; return an error instead")
