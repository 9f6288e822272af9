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
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemkit/idem/internal/configerr"
)

// ErrMalformed marks a URL, or a list of them, that cannot name a broker.
// It matches idem.ErrConfig.
var ErrMalformed = configerr.New("malformed AMQP URL")

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
		return fmt.Errorf("%w: %s: %s", ErrMalformed, Redact(raw), parseReason(raw, err))
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%w: %s: port %s is not a port number (1 to 65535)", ErrMalformed, Redact(raw), p)
		}
	}
	if strings.ContainsAny(u.Host, ",;") {
		return fmt.Errorf("%w: %s: several hosts in one URL; give one URL per node", ErrMalformed, Redact(raw))
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrMalformed, Redact(raw), scrub(err.Error(), u))
	}
	return nil
}

// parseReason says why url.Parse refused raw, precisely and without a
// character of its user info: a bad %-escape or a bad character may be
// part of the password.
func parseReason(raw string, err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return "not a URL"
	}
	why := ue.Err.Error()
	_, rest, _ := strings.Cut(raw, "://")
	authority, _, _ := strings.Cut(rest, "/")
	userinfo := ""
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo = authority[:i]
	}
	switch {
	case strings.HasPrefix(why, "invalid URL escape"):
		esc := strings.Trim(strings.TrimPrefix(why, "invalid URL escape "), `"`)
		if strings.Contains(userinfo, esc) {
			return "a bad %-escape in the user name or password: % must start %XX with two hex digits (write %25 for a % itself)"
		}
		return fmt.Sprintf("a bad %%-escape %q: %% must start %%XX with two hex digits (write %%25 for a %% itself)", esc)
	case strings.HasPrefix(why, "invalid port"):
		return "a bad port" + strings.TrimPrefix(why, "invalid port") + " (a number from 1 to 65535)"
	case strings.Contains(why, "invalid userinfo"):
		return "a character the user name or password must percent-encode"
	case userinfo != "" && strings.Contains(why, userinfo):
		return "not a URL"
	}
	return "cannot be read: " + why
}

// Redact returns raw with the password of every userinfo in it hidden, for
// logs and errors: it does not need raw to parse, so that a malformed URL,
// or several URLs run together, leak no password either.
func Redact(raw string) string {
	out := userinfo.ReplaceAllString(raw, "${1}${2}:xxxxx@")
	if !schemeFirst.MatchString(out) {
		out = bareUserinfo.ReplaceAllString(out, "${1}:xxxxx@")
	}
	return out
}

// userinfo matches "user:password@" after a scheme, bareUserinfo at the
// start of a URL without one (which may still hold a URL with one further
// on). A password may hold white space or an unescaped @: such a URL is
// malformed, and its error quotes it redacted, up to the last @ before the
// path.
var (
	userinfo     = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://)([^:@/,;]*):[^/]*@`)
	bareUserinfo = regexp.MustCompile(`^([^:@/,;]*):[^/]*@`)
	schemeFirst  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)
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
		return nil, errBoth
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

// errBoth says a configuration names its broker twice. It matches
// idem.ErrConfig.
var errBoth = configerr.New("set AMQPURL or AMQPURLs, not both")

// ErrMissing says a configuration names no broker. It matches
// idem.ErrConfig.
var ErrMissing = configerr.New("no broker URL (AMQPURL or AMQPURLs)")
