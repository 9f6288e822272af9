package amqpurl

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSplitReadsACommaSeparatedListOfNodes(t *testing.T) {
	urls, err := Split(" amqp://u:p@h1:5681/ , amqp://u:p@h2:5682/,amqps://u:p@h3/vh")
	require.NoError(t, err)
	require.Equal(t, []string{"amqp://u:p@h1:5681/", "amqp://u:p@h2:5682/", "amqps://u:p@h3/vh"}, urls)

	urls, err = Split("amqp://guest:guest@127.0.0.1:5672/")
	require.NoError(t, err)
	require.Len(t, urls, 1)
}

func TestMalformedURLsAreRefusedWithoutTheirPassword(t *testing.T) {
	for name, raw := range map[string]string{
		"empty list":                  "",
		"empty element":               "amqp://u:secret@h1/,",
		"two URLs, no comma":          "amqp://u:secret@h1:5681/amqp://u:secret@h2:5682/",
		"semicolons":                  "amqp://u:secret@h1:5681/;amqp://u:secret@h2:5682/",
		"hosts in authority":          "amqp://u:secret@h1:5681,h2:5682/",
		"bad scheme":                  "http://u:secret@h1/",
		"bad port":                    "amqp://u:secret@h1:port/",
		"white space":                 "amqp://u:secret@h1/ x",
		"no scheme":                   "u:secret@h1",
		"space in password":           "amqp://u:my secret@h1/",
		"no scheme, a URL further on": "u:my secret@h1/amqp://x",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Split(raw)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrMalformed), "%v", err)
			require.NotContains(t, err.Error(), "secret")
		})
	}
}

// A list given as one URL is refused, whatever separates its URLs: the
// client would dial the first node with the rest as its vhost.
func TestCheckRefusesAListGivenAsOneURL(t *testing.T) {
	err := Check("amqp://guest:guest@127.0.0.1:5681/,amqp://guest:guest@127.0.0.1:5682/")
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "several URLs")
	require.NoError(t, Check("amqp://guest:guest@127.0.0.1:5681/my-vhost"))
	require.NoError(t, Check("amqp://127.0.0.1"))
}

func TestRedactAllHidesEveryPassword(t *testing.T) {
	got := RedactAll([]string{"amqp://u:one@h1/", "amqp://u:two@h2/", "amqp://h3/"})
	require.Equal(t, "amqp://u:xxxxx@h1/,amqp://u:xxxxx@h2/,amqp://h3/", got)
}

func TestShuffledKeepsEveryURLOnce(t *testing.T) {
	in := []string{"a", "b", "c", "d"}
	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		out := Shuffled(in)
		require.ElementsMatch(t, in, out)
		seen[out[0]] = true
	}
	require.Len(t, seen, 4, "each node comes first in some order")
	require.Equal(t, []string{"a", "b", "c", "d"}, in, "the caller's slice is left as it was")
}

func TestRedactHidesPasswordsEvenInMalformedText(t *testing.T) {
	for raw, want := range map[string]string{
		"amqp://u:pw@h1:5681/vh":                    "amqp://u:xxxxx@h1:5681/vh",
		"amqp://u:pw@h1:5681/amqp://v:pw2@h2:5682/": "amqp://u:xxxxx@h1:5681/amqp://v:xxxxx@h2:5682/",
		"u:pw@h1":              "u:xxxxx@h1",
		"amqp://h1:5672/":      "amqp://h1:5672/",
		"amqp://user@h1/":      "amqp://user@h1/",
		"amqps://u:p%40ss@h1/": "amqps://u:xxxxx@h1/",
		"amqp://u:my pw@h1/":   "amqp://u:xxxxx@h1/",
		"u:p w@h1/amqp://x":    "u:xxxxx@h1/amqp://x",
	} {
		require.Equal(t, want, Redact(raw), raw)
	}
}

func TestNodesTakesOneURLOrAListNeverBoth(t *testing.T) {
	got, err := Nodes("amqp://h1/", nil)
	require.NoError(t, err)
	require.Equal(t, []string{"amqp://h1/"}, got)
	got, err = Nodes("", []string{"amqp://h1/", "amqp://h2/"})
	require.NoError(t, err)
	require.Equal(t, []string{"amqp://h1/", "amqp://h2/"}, got)

	_, err = Nodes("amqp://h1/", []string{"amqp://h2/"})
	require.ErrorContains(t, err, "not both")
	_, err = Nodes("", nil)
	require.ErrorIs(t, err, ErrMissing)
	_, err = Nodes("amqp://h1/,amqp://h2/", nil)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = Nodes("", []string{"amqp://h1/", "nope"})
	require.ErrorIs(t, err, ErrMalformed)
}

// A URL the parser refuses is reported with the reason, precise enough to
// fix it, and never with a character of the password, even one the reason
// is about.
func TestAMalformedURLSaysWhatIsWrongWithoutThePassword(t *testing.T) {
	for raw, want := range map[string]string{
		"amqp://u:s3cret@h1:56x2/":    `a bad port ":56x2" after host`,
		"amqp://u:s3cret@h1:99999/":   "port 99999 is not a port number (1 to 65535)",
		"amqp://u:s3cret@h1:0/":       "port 0 is not a port number",
		"amqp://u:s3%zzcret@h1/":      "a bad %-escape in the user name or password",
		"amqp://u:s3cret@h1/v%zz":     `a bad %-escape "%zz"`,
		"amqp://u:s3cret@[::1/":       "missing ']' in host",
		"amqp://u:s3cret@h1:5672/%2f": "",
	} {
		err := Check(raw)
		if want == "" {
			require.NoError(t, err, raw)
			continue
		}
		require.ErrorIs(t, err, ErrMalformed, raw)
		require.Contains(t, err.Error(), want, raw)
		require.NotContains(t, err.Error(), "s3", raw)
		require.NotContains(t, err.Error(), "cret", raw)
		require.NotContains(t, err.Error(), "not a URL", raw)
	}
}
