package amqpurl

import (
	"errors"
	"strings"
	"testing"
)

// FuzzURLsNeverLeakThePassword: a broker URL comes from an operator's flag
// or environment, and is logged and quoted in errors. Whatever its parts
// hold, Check and Split refuse it with ErrMalformed or accept it, and
// neither their errors nor Redact ever show its password; a list Split
// accepts is URLs Check accepts, which Split reads again the same when
// joined by commas.
func FuzzURLsNeverLeakThePassword(f *testing.F) {
	f.Add("guest", "s3cr3t-pw", "127.0.0.1:5672", "/", uint8(0))
	f.Add("u", "pa:ss,word", "h1,h2", "/v", uint8(1))
	f.Add("u", "p@ssw0rd", "host:x", "", uint8(0))
	f.Add("", "hunter22", "[::1]:5672", "/%zz", uint8(2))
	f.Add("u", "pass word", "h", "/amqp://x", uint8(3))
	f.Add("u", "p@ss@word", "h", "/v", uint8(0))
	f.Fuzz(func(t *testing.T, user, password, host, path string, scheme uint8) {
		raw := []string{"amqp://", "amqps://", "AMQP://", "", "http://"}[scheme%5] + user + ":" + password + "@" + host + path
		secret := password
		if len(secret) < 6 || strings.Contains(": "+raw[:len(raw)-len(password+"@"+host+path)]+host+path+"xxxxx: ", secret) ||
			strings.ContainsAny(secret, "/") || strings.ContainsAny(user, ":@/,;") {
			// A password too short, or written elsewhere in the URL or by
			// the ": " an error puts around it, to tell a leak from the rest; a "/" in it ends the URL's authority
			// sooner, and so does a user name that holds what separates a
			// URL's parts.
			return
		}
		for _, s := range []string{Redact(raw), RedactAll([]string{raw, raw})} {
			if strings.Contains(s, secret) {
				t.Fatalf("%q redacted as %q", raw, s)
			}
		}
		if err := Check(raw); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("%q: %v is not ErrMalformed", raw, err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("%q: the error %q shows the password", raw, err)
			}
		}
		urls, err := Split(raw + ", " + raw)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || strings.Contains(err.Error(), secret) {
				t.Fatalf("%q twice: %v", raw, err)
			}
			return
		}
		for _, u := range urls {
			if err := Check(u); err != nil {
				t.Fatalf("%q: Split gives %q, which Check refuses: %v", raw, u, err)
			}
		}
		again, err := Split(strings.Join(urls, ","))
		if err != nil || strings.Join(again, "\n") != strings.Join(urls, "\n") {
			t.Fatalf("%q: %q joined reads as (%q, %v)", raw, urls, again, err)
		}
	})
}
