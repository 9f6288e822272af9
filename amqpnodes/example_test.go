package amqpnodes_test

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/amqpnodes"
	"github.com/idemkit/idem/internal/testkit/exampleenv"
)

// A publisher given the cluster's nodes in IDEM_AMQP_URL dials whichever
// answers first.
func ExampleDial() {
	// A node that is down (port 1) and one that is up.
	urls, err := amqpnodes.Split("amqp://guest:guest@127.0.0.1:1/," + exampleenv.AMQPURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	conn, node, err := amqpnodes.Dial(context.Background(), urls, amqp.Config{})
	if err != nil {
		fmt.Println(err) // no node answered
		return
	}
	defer conn.Close()
	fmt.Println("connected to the node that is up:", node == urls[1])
	// Output: connected to the node that is up: true
}

func ExampleSplit() {
	_, err := amqpnodes.Split("amqp://app:secret@mq1:5672/;amqp://app:secret@mq2:5672/")
	fmt.Println(err)
	// Output: malformed AMQP URL: amqp://app:xxxxx@mq1:5672/;amqp://app:xxxxx@mq2:5672/: several URLs in one; give a list (AMQPURLs), or separate them with commas where a list is read
}

// A producer publishes with stable message ids and flushes: Flush returns
// once the broker stored every message, publishing a nacked one again
// through a new connection.
func ExamplePublisher() {
	ctx := context.Background()
	urls, err := amqpnodes.Split(exampleenv.AMQPURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	pub, err := amqpnodes.NewPublisher(ctx, urls)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close()
	// amq.fanout with no queue bound: the broker returns the message, and
	// Flush says so rather than report it stored.
	if err := pub.Publish(ctx, "amq.fanout", "", amqp.Publishing{MessageId: "order-42/confirmed", Body: []byte(`{}`)}); err != nil {
		fmt.Println(err)
		return
	}
	err = pub.Flush(ctx)
	fmt.Println(errors.Is(err, amqpnodes.ErrNotStored))
	// Output: true
}
