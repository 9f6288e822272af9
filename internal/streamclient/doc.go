// Package streamclient is a copy of the RabbitMQ stream client
// (github.com/rabbitmq/rabbitmq-stream-go-client v1.8.3, MIT licensed, see
// LICENSE: Copyright (C) 2021 Gabriele Santomaggio, Portions Copyright (C)
// vmware), with one patch, so that a stream record the client cannot
// decode reaches idem as such instead of ending the process. idem reads
// and writes streams only through this copy.
//
// Copied: pkg/amqp, pkg/logs, pkg/message and pkg/stream, without their
// tests; stream/environment_debug.go (built only with the debug tag) is
// left out. Import paths point into this directory, and gofmt reordered
// the imports. Everything else is upstream's, but for this patch:
//
//   - amqp/decodeerror.go (new): DecodeError, and Decode, which decodes a
//     record and recovers a panic of the decoder.
//   - amqp/types.go: Message has a DecodeError field, set only by the
//     consumer for a record it could not decode.
//   - stream/server_frame.go: decodeMessage decodes with amqp.Decode
//     instead of Message.UnmarshalBinary, reads a record only as far as
//     its bytes go (readRecord: upstream allocated the size the record
//     declares, up to 4 GiB, before reading), and delivers a record it
//     cannot decode as a Message holding only its DecodeError, at its
//     offset. Upstream delivered an empty Message
//     after logging an error, and a panic of the decoder (a map or a list
//     as a message-annotation key: "hash of unhashable type") ended the
//     process, on every restart, since the record is read again. A
//     sub-entry batch that cannot be uncompressed delivers each of its
//     records so (upstream read them from a nil reader and panicked).
//   - amqp/decode.go, amqp/buffer.go: the arrays of a message hold no
//     more elements in all than the message has bytes (readArrayHeader).
//     Upstream allocated the elements an array declares before reading
//     them, and elements of a type that takes no byte (true, false, uint0,
//     ulong0) are read without any: a record of twenty bytes made a
//     4 to 32 GiB allocation, which ends the process.
//   - stream/aggregation.go: an uncompressed sub-entry batch is read as
//     its stated size, so the record sizes its publisher wrote inside it
//     cannot reach into the entries after it.
//
// idem's own tests of the patch are stream/undecodable_test.go, with the
// fuzz target FuzzDecodeRecord. The files of amqp/ keep the copyright
// notices of the AMQP library they come from.
//
// Every change is marked "idem's patch" in a comment. To take a new
// upstream version: copy its four packages over these (without tests),
// point the imports here, and apply the marked changes again; the tests
// say whether they still hold (TestUpstreamDecoderPanicsOnAMapAsAnnotationKey
// fails once upstream stops panicking).
//
// Why a copy: the client decodes on its own reading goroutine, beyond
// any recover of idem's, and opens its sockets itself (no dial hook; in a
// cluster it connects to the hosts the broker advertises), so nothing
// around it can screen the records; a replace directive in go.mod would
// not reach the programs that import idem.
package streamclient
