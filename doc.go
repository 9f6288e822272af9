// Package idem holds the vocabulary that idem's packages share: payload hashes,
// the replay mode carried in a context, and the names of the tables idem owns.
//
// idem consumes RabbitMQ messages effectively once. The runtime lives in
// package consumer, the inbox claim in package inbox, the side-effect ledger in
// package ledger, stream replay in package replay and the schema in package
// migrate. See the README for the concepts and the operations guide.
package idem
