package deadletters

import "time"

// SetAfterConfirm makes Redrive call f after a chunk's confirms and before
// its rows are marked and its messages acked: the external tests cut the
// connection there. (The tests that run a consumer live in package
// deadletters_test, since the consumer imports this package.)
func SetAfterConfirm(o *RedriveOptions, f func()) { o.afterConfirm = f }

// SetBrokerTimeout replaces the bound on each broker call of Redrive.
func SetBrokerTimeout(o *RedriveOptions, d time.Duration) { o.brokerTimeout = d }
