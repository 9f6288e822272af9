// Package consumertest helps users test their handlers against a real
// PostgreSQL, in the spirit of net/http/httptest: a fresh schema per test,
// messages delivered (duplicates included) through the same pipeline the
// runtime uses, and assertions on what became of each.
//
// # A test per guarantee
//
// A handler's test reads like the guarantee it checks. This one delivers a
// deposit three times and requires that it was processed once:
//
//	func TestDepositAppliesOnce(t *testing.T) {
//		pool := testPool(t) // your test database
//		tables := consumertest.Schema(t, pool)
//		c, err := consumer.New(consumer.Config{Name: "billing", Pool: pool, Tables: tables})
//		if err != nil {
//			t.Fatal(err)
//		}
//		c.Handle(applyDeposit)
//		m := consumertest.MessageJSON("m-1", Deposit{Account: "A1", Amount: 5})
//		out := consumertest.Deliver(t, c, consumertest.Times(3, m)...)
//		consumertest.RequireProcessed(t, out, "m-1")
//		consumertest.RequireDuplicates(t, out, "m-1", 2)
//	}
//
// # The database
//
// Schema creates a schema with idem's tables, migrated, under a random name,
// and drops it when the test ends: tests run in parallel without seeing each
// other's rows. Create your business tables in it (Tables.QuotedSchema names
// it) or anywhere else. The pool is yours: a test database that CI starts,
// for instance; the consumer needs no broker, since Deliver calls
// consumer.Consumer.Process, which runs the same claim, handler, dead-letter
// and commit steps as Run.
//
// # Delivering messages
//
// Message and MessageJSON build a message with a message-id; Times repeats it, as
// a broker redelivering it would. Deliver runs the messages as one batch,
// the way a busy queue hands them to a worker; DeliverEach runs each in a
// batch of its own, the way a quiet queue does:
//
//	out := consumertest.DeliverEach(t, c,
//		consumertest.MessageJSON("m-1", Deposit{Account: "A1", Amount: -5}),
//		consumertest.Message("m-2", []byte(`{"account":`)),
//	)
//	consumertest.RequireDeadLettered(t, out, "m-1", "invalid_deposit")
//	consumertest.RequireDeadLettered(t, out, "m-2", "decode_error")
//
// # Assertions
//
// RequireProcessed, RequireDuplicates and RequireDeadLettered fail the test
// with every outcome listed when the messages did not end as expected;
// Outcomes counts the results by outcome for assertions of your own. A
// handler error makes a message idem.Retried: Process commits nothing
// for it and leaves the retry to its caller.
//
// What needs a broker (retry queues, acks, reconnects, shutdown) is the
// runtime's to test, and idem's own tests do, against a real RabbitMQ.
package consumertest
