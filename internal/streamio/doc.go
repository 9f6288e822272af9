// Package streamio reads and writes RabbitMQ streams for idem's stream
// source and replay runner, on top of internal/streamclient (idem's copy
// of rabbitmq-stream-go-client), and fixes what the client gets wrong or
// leaves out for them:
//
//   - Undecodable records: a record the client could not decode comes as a
//     Record that says so (Undecodable), for the caller to dead-letter.
//   - Throughput: connections keep the kernel's socket buffer autotuning
//     (the client's default 8 KiB read buffer caps consumption at a few
//     hundred messages per second on loopback).
//   - Bounded reads: streams have no end-of-stream signal, so Read fixes its
//     end (the tail, an offset or a time) when it starts and stops by itself
//     there, ignoring the rest of the final chunk.
//   - Batches under flow control: fn gets what is already buffered, one batch
//     at a time on the caller's goroutine; while it runs the broker is held
//     back by credits, so memory stays bounded.
//   - Time: timestamp positions are chunk-granular at the broker; Read drops
//     the records whose creation time falls outside the requested range.
//   - Tail: the last committed offset on brokers older than 3.11, which lack
//     the stream statistics command.
//
// Only what RabbitMQ 3.10 supports is used: no single active consumer, super
// streams, filtering or stream statistics.
package streamio
