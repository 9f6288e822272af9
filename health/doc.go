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
// of its own to each host of its URL, all hosts at once: it is ready while
// one host gives a read-write session within 2 seconds, whatever the
// others do (a dead first host of a multi-host URL costs the probe
// nothing), and not ready at once when every host refuses, stays silent
// for 2 seconds (a blackholed link, a frozen server) or is read-only (a
// standby after a failover). The consumer and the dispatcher run one each while they run; an
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
// # For alerts
//
// ObserveReady exports a Reporter's readiness as the gauge idem.health.ready
// (1 or 0, by component), for an alert on what /readyz answers. The
// consumer and the ledger dispatcher register themselves; register a
// Reporter of your own, such as an HTTP edge's Database, with it.
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
