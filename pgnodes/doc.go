// Package pgnodes configures pgx pools so that a PostgreSQL host that stops
// answering costs seconds, not minutes: a lost machine, a frozen primary, a
// link that drops packets, or the first host of a multi-host URL that
// accepts connections and never answers.
//
// # A pool
//
// idem takes the pool a worker builds (consumer.Config.Pool,
// ledger.DispatcherConfig.Pool, …). Build it with ParseConfig, or New, in
// place of pgxpool.ParseConfig and pgxpool.New:
//
//	cfg, err := pgnodes.ParseConfig(os.Getenv("IDEM_PG_URL"))
//	if err != nil {
//		log.Fatal(err) // the error never quotes the password
//	}
//	cfg.MaxConns = 16 // tune it as any pgxpool.Config
//	pool, err := pgxpool.NewWithConfig(ctx, cfg)
//
// A PostgreSQL pair with a standby is reached through a multi-host URL
// that asks for the writable node:
//
//	postgres://app:secret@pg1:5432,pg2:5432/app?target_session_attrs=read-write
//
// # What it sets
//
// Where the URL (or the PG* environment) does not set them:
//
//   - Each host gets its own connect timeout, DefaultConnectTimeout (3 s),
//     for the whole of its attempt: TCP, TLS, authentication and the
//     target_session_attrs check. pgx tries the hosts of a URL in order; a
//     host that accepts TCP connections and never answers (a frozen
//     server process, a blackholed port behind a load balancer) costs 3 s
//     per new connection, then the next host answers. Without it, pgx
//     waits on the first host for as long as the caller's context allows,
//     and a caller without a deadline waits forever. connect_timeout in the
//     URL overrides it (in whole seconds; pgx, like libpq, applies it to
//     each host). A host that sends nothing within nine tenths of it is
//     suspect for 10 s: a new connection gives it half a second before
//     the next host is tried, so a frozen first host costs each new
//     connection 0.5 s, not 3 s; a host that answers is trusted again.
//   - pgx cancels a statement cut by its deadline over a connection of
//     its own and then closes the statement's connection, waiting up to
//     15 s for the server each time, while the pool slot stays taken: a
//     pool whose every slot was on a silent host could not dial the next
//     host for 15 s. The cancel's connection is bounded like any new one
//     (no byte from the server in time), and the close to 1 s.
//   - Every TCP connection sends keepalives after 4 s of silence, every
//     2 s, and gives up after 3 unanswered ones; on Linux its unacknowledged
//     data is abandoned after 10 s (TCP_USER_TIMEOUT). A connection to a
//     machine that vanished (no FIN, no RST) fails within about 10 s, even
//     under a call without a deadline. A Unix socket has no such failure.
//   - A pooled connection that was idle for a second is pinged before it
//     is handed out, and the ping is abandoned after DefaultPingTimeout
//     (2 s): a connection to a host that stopped answering while it sat in
//     the pool is destroyed, and a new one is dialled, instead of holding
//     the caller until its own deadline. pool_ping_timeout in the URL
//     overrides it.
//
// Nothing is sent to the server: no startup parameter is added, so a pool
// through PgBouncer or another proxy works as before. Statement and lock
// bounds are the caller's: idem bounds each of its own statements with a
// context deadline (consumer.Config.CommitTimeout, HandlerTimeout) and sets
// lock_timeout and idle_in_transaction_session_timeout in its
// transactions.
//
// A process frozen by the operating system (SIGSTOP, a VM paused) still
// has a kernel that acknowledges TCP and answers keepalives: only the
// deadlines above notice it. A new connection fails at the connect
// timeout, then uses the next host. A connection that was in use when it
// froze fails as soon as its host turns suspect: a new connection to that
// host, the pool's or a health probe's (health.Database, over the pool's
// config), that got no byte within nine tenths of the connect timeout, or
// that its caller gave up on after 1.5 s without one, ends the reads in
// progress on every open connection to the host, so that their statements
// fail and are retried (on the promoted standby, after a failover) within
// seconds, instead of at their own deadlines. A connection idle in the
// pool is left to the ping above.
//
// # The hosts of a URL
//
// Hosts splits a connection config into one config per host, each reaching
// that host alone with the same settings: what a probe needs to ask every
// host at once instead of one after another (see health.Database).
package pgnodes
