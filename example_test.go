package idem_test

import (
	"context"
	"fmt"

	"github.com/idemkit/idem"
)

// Where idem's tables live: always quoted, so any schema or prefix is safe.
func ExampleTables_Table() {
	billing := idem.Tables{Schema: "billing"}
	fmt.Println(billing.Table("inbox"))
	fmt.Println(idem.Tables{}.Table("ledger"))
	// Output:
	// "billing"."idem_inbox"
	// "public"."idem_ledger"
}

// A handler that reports instead of writing during a forensic replay, whose
// transaction is READ ONLY.
func ExampleModeFrom() {
	handle := func(ctx context.Context) error {
		if idem.ModeFrom(ctx) == idem.Forensic {
			return nil // report, do not write: the transaction is READ ONLY
		}
		fmt.Println("write")
		return nil
	}
	_ = handle(context.Background())
	_ = handle(idem.WithMode(context.Background(), idem.Forensic))
	// Output:
	// write
}

// One canonical spelling: key order, whitespace and the spelling of numbers
// do not count; string content does.
func ExampleCanonicalJSON() {
	out, err := idem.CanonicalJSON([]byte(`{ "b": [1.0, 10e-1, -0], "a": "x\u00e9" }`))
	fmt.Println(string(out), err)
	// Output:
	// {"a":"xé","b":[1,1,0]} <nil>
}
