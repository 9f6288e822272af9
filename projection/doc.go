// Package projection helps a consumer's handler keep a projection — read
// tables derived from a stream of events — correct under redelivery, out of
// order events and rebuilds.
//
// # Declaring a projection
//
// A Projection names the tables the handler writes:
//
//	overview, err := projection.New(projection.Config{
//		Name:   "order_overview",
//		Schema: "orders",
//		Tables: []string{"order_overview"},
//	})
//
// The handler builds its SQL with Table, which returns the quoted, qualified
// live table, or its shadow copy while a rebuild runs the handler:
//
//	_, err := tx.Exec(ctx, `INSERT INTO `+overview.Table(ctx, "order_overview")+` …`, …)
//
// Pass the projection to a rebuild (replay.Options.Projection): the rebuild
// builds every declared table again beside the live one, catches up with
// the live consumer and swaps the tables in one transaction, while the
// live worker keeps running and readers keep reading (see package replay).
// Declare every table the handler writes: a table that is not declared is
// written live during a rebuild.
//
// # Newest wins: the version guard
//
// Events of one entity carry a version (1, 2, 3 …). A Guard applies an
// event only when it is newer than the entity's row: a late duplicate, or an
// event overtaken by a newer one, is stale and a no-op. What happens to an
// event that skips versions (version 3 while the row is at 1) is the guard's
// GapPolicy: GapApply applies it (the row shows the newest state known; the
// missing event is stale when it comes), GapPark keeps it aside until the
// versions before it are applied, GapFail fails the message so that the
// consumer retries it and finally dead-letters it.
//
//	guard, err := projection.NewGuard(projection.GuardConfig[event]{
//		Projection: overview, Table: "order_overview", KeyColumn: "order_id", VersionColumn: "version",
//		Key:     func(ev event) string { return ev.OrderID },
//		Version: func(ev event) int64 { return ev.Version },
//		Apply:   upsert,
//	})
//	…
//	decision, err := guard.Handle(ctx, tx, ev) // Applied, Stale or Parked
//
// With GapApply or GapPark the final rows do not depend on the order in
// which the events arrived, so a rebuild reproduces what the live consumer
// built. In forensic replays the guard only reads and returns what it would
// do.
//
// # Metrics
//
// Every decision is counted in idem.projection.events, with the attributes
// idem.projection (the projection's name), decision (applied, applied_gap,
// stale, parked, unparked, gap_failed) and idem.mode (live, or the replay
// mode).
package projection
