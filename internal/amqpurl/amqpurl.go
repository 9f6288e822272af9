// Package amqpurl reads the broker URLs idem is given: a list of a
// cluster's nodes, comma-separated where one string carries them (the
// IDEM_AMQP_URL variable, the -amqp-url flags), each checked before any dial
// so that a malformed URL is refused at once instead of being retried as
// an unavailable broker, and each redacted wherever it is logged.
package amqpurl

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"regexp"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrMalformed marks a URL, or a list of them, that cannot name a broker.
var ErrMalformed = errors.New("malformed AMQP URL")

// Split returns the URLs of list, separated by commas (spaces around them
// are ignored), each checked by Check. An empty list, or an empty element,
// is malformed.
func Split(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("%w: no URL", ErrMalformed)
	}
	parts := strings.Split(list, ",")
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("%w: URL %d of %d is empty", ErrMalformed, i+1, len(parts))
		}
		out = append(out, p)
	}
	if err := CheckAll(out); err != nil {
		return nil, err
	}
	return out, nil
}

// CheckAll checks every URL of urls (see Check); there must be at least
// one.
func CheckAll(urls []string) error {
	if len(urls) == 0 {
		return fmt.Errorf("%w: no URL", ErrMalformed)
	}
	for i, u := range urls {
		if err := Check(u); err != nil {
			if len(urls) == 1 {
				return err
			}
			return fmt.Errorf("URL %d of %d: %w", i+1, len(urls), err)
		}
	}
	return nil
}

// Check refuses a URL that cannot name one broker node: one that the
// client cannot parse (scheme amqp or amqps, a host, a port that is a
// number), and one that holds several URLs or hosts (a vhost with "://" in
// it, a host list "h1,h2", separators "," or ";"), which the client would
// otherwise read as one node with a strange vhost. The error never quotes
// the password.
func Check(raw string) error {
	if strings.ContainsAny(raw, " \t\r\n") {
		return fmt.Errorf("%w: %s: contains white space", ErrMalformed, Redact(raw))
	}
	lower := strings.ToLower(raw)
	if strings.Count(lower, "amqp://")+strings.Count(lower, "amqps://") > 1 {
		return fmt.Errorf("%w: %s: several URLs in one; give a list (AMQPURLs), or separate them with commas where a list is read", ErrMalformed, Redact(raw))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%w: %s: not a URL", ErrMalformed, Redact(raw))
	}
	if strings.ContainsAny(u.Host, ",;") {
		return fmt.Errorf("%w: %s: several hosts in one URL; give one URL per node", ErrMalformed, Redact(raw))
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrMalformed, Redact(raw), scrub(err.Error(), u))
	}
	return nil
}

// Redact returns raw with the password of every userinfo in it hidden, for
// logs and errors: it does not need raw to parse, so that a malformed URL,
// or several URLs run together, leak no password either.
func Redact(raw string) string {
	if strings.Contains(raw, "://") {
		return userinfo.ReplaceAllString(raw, "${1}${2}:xxxxx@")
	}
	return bareUserinfo.ReplaceAllString(raw, "${1}:xxxxx@")
}

// userinfo matches "user:password@" after a scheme, bareUserinfo at the
// start of a URL without one.
var (
	userinfo     = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^:@/\s,;]*):[^@\s]*@`)
	bareUserinfo = regexp.MustCompile(`^([^:@/\s,;]*):[^@\s]*@`)
)

// RedactAll returns the URLs redacted, comma-separated.
func RedactAll(urls []string) string {
	out := make([]string, len(urls))
	for i, u := range urls {
		out[i] = Redact(u)
	}
	return strings.Join(out, ",")
}

// Shuffled returns a copy of urls in a random order: each process of a
// fleet given the same list spreads its connections over the nodes, and
// dials the next one when one fails.
func Shuffled(urls []string) []string {
	out := append([]string(nil), urls...)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// scrub removes u's password from msg.
func scrub(msg string, u *url.URL) string {
	if pw, ok := u.User.Password(); ok && pw != "" {
		return strings.ReplaceAll(msg, pw, "xxxxx")
	}
	return msg
}

// Nodes returns the broker's nodes as a configuration gives them: one URL
// (an AMQPURL field) or a list (an AMQPURLs field), never both, each
// checked. Neither is an error wrapping ErrMissing.
func Nodes(one string, many []string) ([]string, error) {
	switch {
	case one != "" && len(many) > 0:
		return nil, errors.New("set AMQPURL or AMQPURLs, not both")
	case one != "":
		if err := Check(one); err != nil {
			return nil, err
		}
		return []string{one}, nil
	case len(many) > 0:
		if err := CheckAll(many); err != nil {
			return nil, err
		}
		return append([]string(nil), many...), nil
	}
	return nil, ErrMissing
}

// ErrMissing says a configuration names no broker.
var ErrMissing = errors.New("no broker URL (AMQPURL or AMQPURLs)")
