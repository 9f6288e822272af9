package pglock_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/pglock"
)

func ExampleKey() {
	fmt.Println(pglock.Key("orders/stream-a"))
	// Output: -635469962069592284
}

// One active reader per consumer and stream: every process runs this loop;
// one reads, the others wait in Acquire as hot standbys.
func ExampleAcquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://root@127.0.0.1:5432/test?sslmode=disable")
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	for ctx.Err() == nil {
		lock, err := pglock.Acquire(ctx, pool, "billing/orders", pglock.Config{})
		if err != nil {
			return // ctx ended
		}
		readCtx, stop := context.WithCancel(ctx)
		go func() {
			select {
			case <-lock.Lost():
				stop() // another process may take over now
			case <-readCtx.Done():
			}
		}()
		// ... read the stream with readCtx until it ends ...
		<-readCtx.Done()
		stop()
		_ = lock.Release(context.Background())
	}
}
