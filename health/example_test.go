package health_test

import (
	"fmt"
	"io"
	"net/http/httptest"

	"github.com/idemkit/idem/health"
)

// The probes of a worker whose database went away: live (do not restart
// it), not ready.
func ExampleHandler() {
	dispatcher := health.ReporterFunc(func() health.Status {
		return health.Status{Component: "ledger dispatcher", Live: true, Reason: "database: connection refused"}
	})
	srv := httptest.NewServer(health.Handler(dispatcher))
	defer srv.Close()
	for _, path := range []string{health.LivenessPath, health.ReadinessPath} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Print(path, " ", resp.StatusCode, " ", string(body))
	}
	// Output:
	// /healthz 200 {"ok":true,"checks":[{"component":"ledger dispatcher","ready":false,"live":true,"reason":"database: connection refused"}]}
	// /readyz 503 {"ok":false,"checks":[{"component":"ledger dispatcher","ready":false,"live":true,"reason":"database: connection refused"}]}
}
