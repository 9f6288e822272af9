// Command payments captures card payments effectively once. It consumes
// capture requests from a quorum queue, writes one payment row per
// captureRequestId in the same transaction as the inbox row, records a
// "capture" effect in idem's ledger, and lets the ledger's dispatcher call the
// payment gateway with an Idempotency-Key derived from the captureRequestId
// alone. Broker redeliveries, producer retries, gateway outages and responses
// lost after the charge all end in exactly one charge per capture request.
//
//	go run ./examples/payments gateway -addr 127.0.0.1:8099 [-fail-rate 0.2] [-slow-rate 0.1] [-drop-after-charge-rate 0.1] [-webhook-url URL -webhook-secret S]
//	go run ./examples/payments worker  -gateway-url http://127.0.0.1:8099 [-schema payments] [-queue payments.capture.requested] [-partitions 8] [-metrics-addr 127.0.0.1:9464] [-health-addr 127.0.0.1:8081]
//	go run ./examples/payments publish [-n 1000] [-dup 0.2] [-retry 0.1] [-bad] [-partitions 8]
//	go run ./examples/payments api     -addr 127.0.0.1:8098 [-schema payments] [-queue payments.capture.requested] [-webhook-secret S] [-wait 2s] [-lease 30s] [-expiry 24h] [-metrics-addr 127.0.0.1:9465] [-health-addr 127.0.0.1:8082]
//	go run ./examples/payments demo    [-n 1000] [-http=true] [-bulk-n 20] [-fail-rate 0.1] [-drop-after-charge-rate 0.1]
//
// The api subcommand serves POST /captures with a required Idempotency-Key
// and puts each accepted request on the queue through the ledger's outbox,
// in the same transaction: one key, one captureRequestId, one charge. It
// answers 202 with Location /captures/{captureRequestId}, a long-running
// operation that follows the worker's capture to succeeded, failed or
// unknown. POST /captures:bulk takes up to 100 captures at once, with an
// Idempotency-Key for the operation and an itemKey per capture. With a
// webhook secret (-webhook-secret or PAYMENTS_WEBHOOK_SECRET) it serves
// POST /webhooks/gateway: the gateway's signed capture.settled events,
// appended to gateway_events once each, however often they come.
//
// A message is JSON with the AMQP message-id and correlation-id set:
//
//	{"schemaVersion":1,"captureRequestId":"cr-1","orderId":"o-1","amount":1234,"currency":"EUR"}
//
// IDEM_PG_URL and IDEM_AMQP_URL say where PostgreSQL and RabbitMQ are; for a
// RabbitMQ cluster, IDEM_AMQP_URL (or -amqp-url) lists its nodes' URLs,
// comma-separated.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one subcommand: run parses its own flags from args.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

// commands are the subcommands by name.
var commands = map[string]command{
	"api":     {"serve POST /captures (and :bulk) with Idempotency-Key, publish accepted requests through the outbox; receive the gateway's webhooks", runAPI},
	"demo":    {"run gateway, worker and publisher in one process and check for double charges", runDemo},
	"gateway": {"serve a fake payment provider that honours Idempotency-Key, injects faults and sends signed webhooks", runGateway},
	"publish": {"publish capture requests with duplicates, producer retries and bad messages", runPublish},
	"worker":  {"consume capture requests and dispatch the captures to the gateway", runWorker},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := runCommand(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}

func runCommand(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(usage())
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Println(usage())
		return nil
	}
	cmd, ok := commands[args[0]]
	if !ok {
		return fmt.Errorf("unknown command %q\n%s", args[0], usage())
	}
	return cmd.run(ctx, args[1:])
}

func usage() string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: payments <command> [flags]\n\ncommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-8s %s\n", n, commands[n].summary)
	}
	return strings.TrimSuffix(b.String(), "\n")
}
