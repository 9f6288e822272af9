package streamio_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idem/internal/streamio"
)

func ExampleStreamURL() {
	uri, err := streamio.StreamURL("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		panic(err)
	}
	fmt.Println(uri)
	fmt.Println(streamio.Redact(uri))
	// Output:
	// rabbitmq-stream://guest:guest@127.0.0.1:5552/
	// rabbitmq-stream://guest:xxxxx@127.0.0.1:5552/
}

// A bounded replay of the last hour: the end is the tail when Read starts,
// and Read returns by itself once it has handed over the last record.
func ExampleEnv_Read() {
	ctx := context.Background()
	env, err := streamio.Open(ctx, streamio.Config{URI: streamio.URLFromEnv()})
	if err != nil {
		panic(err)
	}
	defer env.Close()

	spec := streamio.ReadSpec{
		Stream:   "orders",
		From:     streamio.Time(time.Now().Add(-time.Hour)),
		To:       streamio.Tail(),
		MaxBatch: 500,
	}
	err = env.Read(ctx, spec, func(ctx context.Context, batch []streamio.Record) error {
		// One database transaction per batch; commit the checkpoint
		// batch[len(batch)-1].Offset in it.
		for _, r := range batch {
			fmt.Println(r.Offset, r.MessageID)
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
}

// A live reader resumes after its checkpoint and reconnects when the
// subscription drops.
func ExampleEnv_Follow() {
	ctx := context.Background()
	env, err := streamio.Open(ctx, streamio.Config{URI: streamio.URLFromEnv()})
	if err != nil {
		panic(err)
	}
	defer env.Close()

	next := int64(0) // the checkpoint + 1, from the database
	for ctx.Err() == nil {
		err := env.Follow(ctx, "orders", next, 500, func(ctx context.Context, batch []streamio.Record) error {
			next = batch[len(batch)-1].Offset + 1 // after the batch committed
			return nil
		})
		if err != nil {
			time.Sleep(time.Second)
		}
	}
}
