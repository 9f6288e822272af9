package run_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/idemkit/idem/consumer"
	"github.com/idemkit/idem/health"
	"github.com/idemkit/idem/ledger"
	"github.com/idemkit/idem/run"
)

// A worker's parts run until one of them stops: here the "consumer" fails,
// and the "dispatcher" is stopped with it.
func ExampleAll() {
	consumer := func(ctx context.Context) error { return errors.New("broker refused the credentials") }
	dispatcher := func(ctx context.Context) error {
		<-ctx.Done()
		fmt.Println("dispatcher stopped")
		return nil
	}
	err := run.All(context.Background(), consumer, dispatcher)
	fmt.Println(err)
	// Output:
	// dispatcher stopped
	// run: part 1: broker refused the credentials
}

// A worker: its consumer, its dispatcher and its health probes, until the
// process is told to stop or one of them stops.
func Example_worker() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var (
		c          *consumer.Consumer // consumer.New(…), with its handlers
		dispatcher *ledger.Dispatcher // ledger.NewDispatcher(…)
	)
	err := run.All(ctx,
		c.Run,          // the consumer
		dispatcher.Run, // the ledger's effects
		func(ctx context.Context) error { return health.ListenAndServe(ctx, "127.0.0.1:8081", c, dispatcher) },
	)
	if err != nil {
		log.Fatal(err)
	}
}
