// Package console is idem's operator console: an http.Handler serving
// server-rendered pages over idem's tables, for the people who answer
// "what happened to message X" and decide what to do about it. It needs no
// JavaScript, loads nothing from elsewhere, and acts only through the
// libraries' operator functions, which audit every decision.
//
// # Mounting it in a worker
//
// New takes the database and where idem's tables are; everything else has
// a safe default:
//
//	c, err := console.New(console.Config{
//		Pool:      pool,
//		Tables:    idem.Tables{Schema: "billing"},
//		AMQPURLs:  []string{os.Getenv("IDEM_AMQP_URL")},
//		Prefix:    "/console",
//		BasicAuth: map[string]string{"alice": os.Getenv("CONSOLE_ALICE_PASSWORD")},
//	})
//
// and a mux serves it under its Prefix:
//
//	mux := http.NewServeMux()
//	mux.Handle("/console/", c)
//
// The command line runs the same handler on its own: `idem console --addr
// 127.0.0.1:8080 --schema billing`.
//
// # The screens
//
//   - Overview: per consumer, the messages processed, the duplicates, the
//     dead letters and the payload conflicts of the last hour, counted from
//     the inbox and dead-letter tables; the depth of each queue, its retry
//     queue and its dead-letter queue; the stream checkpoints; the inbox
//     horizon and the last retention pass; the readiness of Config.Health;
//     the partition holders.
//   - Dead letters: grouped by consumer and reason, a filtered list, each
//     message's row; redrive one, a selection or a group
//     (deadletters.Redrive, which refuses what is beyond the horizon: the
//     page shows each refusal and why), or discard with a reason.
//   - Ledger: unknown effects, failed ones nobody resolved, due and
//     retrying ones; each effect with its keys and audit trail; resolve one
//     or many (ledger.Ledger.Resolve).
//   - HTTP: idempotency keys and operations in progress or unknown, with
//     their resolutions (httpinbox.Keys, httpinbox.Operations).
//   - Replays: the runs with their progress, and what to do with an
//     interrupted rebuild (resume, or abandon: replay.Abandon).
//   - Partitions: which process holds which partition, since when.
//
// # Safe by default
//
// Without Authenticate, BasicAuth or Tokens the console answers only on
// loopback (the listener, the peer and the Host header), and
// Config.Operator acts. With them, the operator the audit trail records is
// who authenticated, never a form field. Every POST passes net/http's
// cross-origin protection and carries a token bound to the browser's
// session. ReadOnly hides every action and refuses every POST. Payloads
// and stored bodies are never sent unless ShowPayloads is set and the
// operator asks for one. Every value from a message is escaped (markup as
// text, control characters as \x1b), under a Content-Security-Policy that
// allows no script and no framing.
//
// # At depth
//
// Every page reads a bounded number of rows through an index: keyset
// pages, windows of the newest rows, and the planner's estimate instead of
// count(*) on a large table. Its pages answer within 200 ms with a million
// dead letters and a million effects (TestEveryPageAnswersFastAtDepth).
package console
