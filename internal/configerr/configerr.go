// Package configerr holds the error that every configuration error of
// idem's packages wraps, so that errors.Is(err, idem.ErrConfig) holds for a
// Config, options or arguments that any package refuses. The root package
// re-exports ErrConfig as idem.ErrConfig; this package exists so that the
// root and the internal packages beneath it can share it without a cycle.
package configerr

import "errors"

// ErrConfig is idem.ErrConfig. A package without a sentinel of its own
// wraps it with its prefix and the reason:
//
//	fmt.Errorf("ledger: %w: DispatcherConfig.Pool is required", idem.ErrConfig)
var ErrConfig = errors.New("invalid configuration")

// New returns a package's own configuration sentinel (consumer.ErrConfig,
// retention.ErrInvalidConfig, …): an error whose text is text, unchanged,
// and that matches ErrConfig under errors.Is.
func New(text string) error { return &sentinel{text: text} }

type sentinel struct{ text string }

func (e *sentinel) Error() string { return e.text }
func (e *sentinel) Unwrap() error { return ErrConfig }
