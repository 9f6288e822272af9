// Package health lets an orchestrator ask a worker two questions over HTTP:
// is it live (making progress, or should it be restarted), and is it ready
// (connected and working, or should it get no traffic).
//
// # Reporters
//
// A component reports a Status through the Reporter interface: Ready when
// it is connected and working, Live when its loops make progress, and a
// short Reason when it is not. The ledger's *Dispatcher reports ready while
// its database takes writes and its notification listener works, and live
// while its loops tick; a consumer reports ready while it is connected and
// consuming (a stream consumer also while it stands by for another
// process), its database takes writes and its batches are not failing, and
// live while its batches complete and no handler is wedged. ReporterFunc
// turns a function into a Reporter for checks of your own.
//
// # The database
//
// Database probes a PostgreSQL database every 2 seconds over a connection
// of its own: a refusal, 2 seconds without an answer (a blackholed link) or
// a read-only session (a standby after a failover) make it not ready at
// once. The consumer and the dispatcher run one each while they run; an
// HTTP edge, which has no loop of its own, serves one beside it:
//
//	db := health.NewDatabase(pool, "api database")
//	go db.Run(ctx)
//	go health.ListenAndServe(ctx, "0.0.0.0:8081", db)
//
// # Serving the probes
//
// Handler serves GET /healthz (liveness) and GET /readyz (readiness): 200
// when every reporter is live (ready), 503 otherwise, with a small JSON body
// that names each component and its reason. Mount it on a mux of your own,
// or let ListenAndServe run a server for it beside the worker until its
// context ends:
//
//	go func() {
//		if err := health.ListenAndServe(ctx, "127.0.0.1:8081", dispatcher, consumer); err != nil {
//			log.Print(err) // the address is taken, say
//		}
//	}()
//
// # Reading the answers
//
// A worker whose database is away is live but not ready: take it out of
// traffic, do not restart it; it recovers when the database does. A worker
// that is not live is wedged (a loop stopped turning, or Run returned with
// an error): restart it. A Kubernetes pod would use:
//
//	livenessProbe:  {httpGet: {path: /healthz, port: 8081}, periodSeconds: 10, failureThreshold: 3}
//	readinessProbe: {httpGet: {path: /readyz,  port: 8081}, periodSeconds: 5}
//
// The example workers serve both with -health-addr; the operations guide
// (docs/operations.md) has the details.
package health
