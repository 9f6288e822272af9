// Package amqpnodes reads and dials the nodes of a RabbitMQ cluster the way
// idem does, for the code beside a worker: publishers, tools, tests.
//
// # A node list
//
// idem takes a cluster as a list of URLs, one per node
// (consumer.Config.AMQPURLs, ledger.AMQPConfig.URLs,
// deadletters.RedriveOptions.AMQPURLs). Where one string must carry the
// list (the IDEM_AMQP_URL variable, the -amqp-url flags of the examples
// and of the idem command), the URLs are separated by commas:
//
//	IDEM_AMQP_URL=amqp://app:secret@mq1:5672/,amqp://app:secret@mq2:5672/,amqp://app:secret@mq3:5672/
//
// Split reads such a string and refuses, at once and without quoting a
// password, a URL that cannot name one node: one the client cannot parse,
// and one that holds several URLs or hosts, which the client would read as
// one node with a strange vhost. Redact hides every password of a URL, or
// of a list, for logs.
//
// # Dialling
//
// Dial connects to the first node that answers, trying them in a shuffled
// order: a fleet given one list spreads its connections over the nodes,
// and a node that is down costs one failed dial, bounded by DialTimeout
// (5 s), even when it takes the TCP connection and never answers. A node
// that failed lately in this process, on a dial or a connection, is tried
// after the others. Connections get 2 s heartbeats unless the Config says
// otherwise: a node that goes silent is noticed within 3 s. A node's
// refusal that dialling again cannot change (credentials, a vhost that
// does not exist) is ErrRefused, and the nodes after it are not dialled:
// users and vhosts belong to the whole cluster, so the caller should stop
// rather than retry. A caller that dials again after a failure runs its
// backoff between rounds of the whole list, as a consumer does between
// sessions.
//
// # Publishing
//
// Publisher publishes persistent, mandatory messages with publisher
// confirms, and its Flush returns once the broker stored every one. A
// quorum queue nacks publishes while it elects a leader, and on RabbitMQ
// 3.10 a connection that saw the election may go on being nacked after it;
// a node may die or go silent with publishes unconfirmed. Flush publishes
// every message that was not confirmed again through a new connection, to
// another node when there is one, with a bounded backoff (MaxRepublish). A
// message returned as unroutable is an error (ErrNotStored). Give every
// message a stable MessageId: a message that was not confirmed may still
// have been stored, and idem's consumers deduplicate on the id.
package amqpnodes
