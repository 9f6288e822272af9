package idem

import "context"

// Mode says why a message is being processed: live consumption or one of the
// replay modes. Packages that record side effects read it from the context to
// decide whether an effect may be dispatched, must be suppressed, or must not
// be written at all.
type Mode string

// The processing modes. The zero value "" means Live.
const (
	// Live is normal consumption by a worker.
	Live Mode = ""
	// Normal is a replay that behaves like live consumption: duplicates are
	// skipped and new effects are dispatched.
	Normal Mode = "normal"
	// Rebuild is a replay that rebuilds a projection: handlers run and write,
	// effects are recorded as suppressed and never dispatched.
	Rebuild Mode = "rebuild"
	// Forensic is a read-only replay: transactions are READ ONLY and always
	// rolled back, effects are captured in memory and reported.
	Forensic Mode = "forensic"
	// Repair re-runs selected messages and audits each one.
	Repair Mode = "repair"
)

type modeKey struct{}

// WithMode returns a context that carries m.
func WithMode(ctx context.Context, m Mode) context.Context {
	return context.WithValue(ctx, modeKey{}, m)
}

// ModeFrom returns the mode carried by ctx, or Live.
func ModeFrom(ctx context.Context) Mode {
	m, _ := ctx.Value(modeKey{}).(Mode)
	return m
}
