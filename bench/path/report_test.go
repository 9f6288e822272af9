package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPathIsEveryMessageRoundMinusAnyControlRound(t *testing.T) {
	a, b, c, d := block{"inbox/claim.go", 1, 2}, block{"internal/engine/run.go", 3, 4}, block{"hash.go", 5, 6}, block{"health/database.go", 7, 8}
	messages := []blockSet{{a: {}, b: {}, c: {}}, {a: {}, b: {}, c: {}, d: {}}}
	controls := []blockSet{{}, {c: {}}}
	require.Equal(t, blockSet{a: {}, b: {}}, onPath(messages, controls))
}

func TestParseProfileKeepsLibraryBlocksHit(t *testing.T) {
	const profile = `mode: atomic
github.com/idemkit/idem/inbox/claim.go:235.60,240.16 3 1
github.com/idemkit/idem/inbox/claim.go:240.16,242.3 1 0
github.com/idemkit/idem/bench/path/main.go:10.2,12.3 1 4
github.com/idemkit/idem/examples/quickstart/main.go:10.2,12.3 1 4
github.com/other/mod/x.go:1.1,2.2 1 9
`
	hit, instrumented, err := parseProfile(strings.NewReader(profile), "github.com/idemkit/idem")
	require.NoError(t, err)
	require.Equal(t, 2, instrumented)
	require.Equal(t, blockSet{{"inbox/claim.go", 235, 60}: {}}, hit)
}

func TestStationsAreTheRuntimePackagesFiles(t *testing.T) {
	for file, want := range map[string]string{
		"consumer/message.go":         "consumer",
		"consumer/window.go":          "consumer",
		"internal/engine/attempt.go":  "internal/engine",
		"inbox/claim.go":              "inbox",
		"inbox/httpinbox/handler.go":  "",
		"hash.go":                     "",
		"internal/sqltext/sqltext.go": "",
	} {
		require.Equal(t, want, stationOf(file), file)
	}
}
