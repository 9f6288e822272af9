package health_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http/httptest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/health"
)

// The probes of a worker whose database went away: live (do not restart
// it), not ready.
func ExampleHandler() {
	dispatcher := health.ReporterFunc(func() health.Status {
		return health.Status{Component: "ledger dispatcher", Live: true, Reason: "database: connection refused"}
	})
	srv := httptest.NewServer(health.Handler(dispatcher))
	defer srv.Close()
	for _, path := range []string{health.LivenessPath, health.ReadinessPath} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Print(path, " ", resp.StatusCode, " ", string(body))
	}
	// Output:
	// /healthz 200 {"ok":true,"checks":[{"component":"ledger dispatcher","ready":false,"live":true,"reason":"database: connection refused"}]}
	// /readyz 503 {"ok":false,"checks":[{"component":"ledger dispatcher","ready":false,"live":true,"reason":"database: connection refused"}]}
}

// Beside a worker: the probes of a dispatcher and a consumer (both are
// Reporters) on their own port, until ctx is cancelled.
func ExampleListenAndServe() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	dispatcher := health.ReporterFunc(func() health.Status { return health.Status{Component: "ledger dispatcher", Ready: true, Live: true} })
	consumer := health.ReporterFunc(func() health.Status { return health.Status{Component: "consumer", Ready: true, Live: true} })
	go func() {
		if err := health.ListenAndServe(ctx, "127.0.0.1:8081", dispatcher, consumer); err != nil {
			log.Print(err) // the address is taken, say
		}
	}()
}

// Beside an HTTP edge, which has no loop of its own: a probe of its
// database, ready while the database takes writes.
func ExampleDatabase() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://root@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := health.NewDatabase(pool, "api database")
	go db.Run(ctx)
	go health.ListenAndServe(ctx, "0.0.0.0:8081", db)
}
