// Package run runs the parts of a worker process together: the consumer,
// the ledger dispatcher, the health probes, retention, a metrics server,
// anything that runs until its context ends.
//
// # Running a worker
//
// Each part is a function that runs until its context ends: a consumer's
// Run, a dispatcher's Run, a closure around health.ListenAndServe or
// retention.Run. All runs them together:
//
//	err := run.All(ctx,
//		c.Run,          // the consumer
//		dispatcher.Run, // the ledger's effects
//		func(ctx context.Context) error { return health.ListenAndServe(ctx, "127.0.0.1:8081", c, dispatcher) },
//	)
//
// # Stopping
//
// All starts each part on a goroutine of its own and returns when every
// part has returned, with the first error a part returned. The first part
// to return, with an error or not, stops the others: a worker whose
// consumer gave up must not go on dispatching and answering its probes as
// if it were healthy; the process exits and its orchestrator restarts it.
//
// Each part must return soon after its context ends. idem's do, after
// draining what they hold in flight within their own bounds: the consumer
// commits and acks its batches, the dispatcher waits for its calls. A part
// still running StopTimeout after the stop is reported with ErrStopTimeout
// and left behind: the process should exit rather than wait for it.
package run
