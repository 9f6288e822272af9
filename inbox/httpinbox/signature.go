package httpinbox

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultTolerance is how far a signed timestamp may be from the receiver's
// clock, either way, when a verifier's Tolerance is 0.
const DefaultTolerance = 5 * time.Minute

// Signature failures. A verifier's error matches one of them; the webhook
// endpoint answers each with 401 and stores and runs nothing.
var (
	// ErrSignatureMissing: the request carries no signature header.
	ErrSignatureMissing = errors.New("httpinbox: webhook signature missing")
	// ErrSignatureInvalid: no signature in the request matches the body
	// under any of the secrets, or it cannot be read.
	ErrSignatureInvalid = errors.New("httpinbox: webhook signature invalid")
	// ErrSignatureStale: the signature is authentic, but the time it signs
	// is further from now than the tolerance: a replay of an old request,
	// or a clock far off.
	ErrSignatureStale = errors.New("httpinbox: webhook signature outside its time tolerance")
)

// A Verifier checks that a webhook request comes from its provider, from
// the raw body and the request's headers, before anything in the request
// (its event id above all) is trusted. Verify returns nil for an authentic
// request, else an error matching ErrSignatureMissing, ErrSignatureInvalid
// or ErrSignatureStale. now is the receiver's clock.
type Verifier interface {
	Verify(r *http.Request, body []byte, now time.Time) error
}

// VerifierFunc adapts a function to Verifier, for instance to pick the
// verifier (and so the secret) of a tenant named in the path.
type VerifierFunc func(r *http.Request, body []byte, now time.Time) error

// Verify calls f.
func (f VerifierFunc) Verify(r *http.Request, body []byte, now time.Time) error {
	return f(r, body, now)
}

// maxSignatureElements bounds the comma-separated elements of a timestamped
// signature header that are looked at.
const maxSignatureElements = 32

// TimestampedHMAC verifies the scheme of Stripe-style providers. Header
// carries "t=<unix seconds>,v1=<hex signature>", where the signature is
// HMAC-SHA256(secret, "<t>.<raw body>"); several v1 elements may appear
// while a provider rotates its secret, and other elements (v0, …) are
// ignored. The timestamp is signed, so Tolerance stops a captured request
// from being replayed later; within the tolerance, the event id's record
// stops it.
type TimestampedHMAC struct {
	// Header is the request header with the signature, e.g.
	// "Stripe-Signature". Required.
	Header string
	// Secrets are the signing secrets, as bytes (Stripe's "whsec_…" string
	// as is). A request signed with any of them is authentic, so a secret
	// can be rotated without downtime. Sign uses the first. Required.
	Secrets [][]byte
	// Tolerance is how far t may be from now, either way. Default:
	// DefaultTolerance.
	Tolerance time.Duration
}

// Verify implements Verifier.
func (v *TimestampedHMAC) Verify(r *http.Request, body []byte, now time.Time) error {
	value, err := signatureHeader(r.Header, v.Header)
	if err != nil {
		return err
	}
	var (
		ts   string
		sigs [][]byte
	)
	for i, el := range strings.Split(value, ",") {
		if i == maxSignatureElements {
			return fmt.Errorf("%w: more than %d elements in %s", ErrSignatureInvalid, maxSignatureElements, v.Header)
		}
		k, val, _ := strings.Cut(strings.TrimSpace(el), "=")
		switch k {
		case "t":
			if ts != "" {
				return fmt.Errorf("%w: two timestamps in %s", ErrSignatureInvalid, v.Header)
			}
			ts = val
		case "v1":
			if sig, err := hex.DecodeString(val); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	t, err := unixSeconds(ts)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrSignatureInvalid, v.Header, err)
	}
	if !anyMatch(v.Secrets, sigs, []byte(ts+"."), body) {
		return fmt.Errorf("%w: no v1 signature in %s matches", ErrSignatureInvalid, v.Header)
	}
	return withinTolerance(t, now, v.Tolerance)
}

// Sign returns the header value a provider would send for body at t,
// signed with the first secret: what a test, or a fake provider, sends.
func (v *TimestampedHMAC) Sign(body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(firstSecret(v.Secrets), []byte(ts+"."), body))
}

func (v *TimestampedHMAC) validate() error { return validateHMAC(v.Header, v.Secrets, v.Tolerance) }

// BodyHMAC verifies an HMAC-SHA256 of the raw body alone, in hex (or
// base64) in Header after Prefix: GitHub's X-Hub-Signature-256 (see GitHub)
// and the generic scheme of many providers.
//
// The signature covers no time, so by itself it does not stop a captured
// request from being replayed: the event id's record does, for as long as it
// is kept (Webhook.Expiry). Set Timestamp when the provider puts the send
// time inside the signed body, and Tolerance then bounds replays as
// TimestampedHMAC does.
type BodyHMAC struct {
	// Header is the request header with the signature. Required.
	Header string
	// Prefix comes before the signature in the header, e.g. "sha256=". A
	// header without it is invalid.
	Prefix string
	// Base64 says the signature is standard base64; default: hex.
	Base64 bool
	// Secrets are the signing secrets; a request signed with any of them is
	// authentic. Sign uses the first. Required.
	Secrets [][]byte
	// Timestamp, when set, returns the time the provider sent the request,
	// read from what the signature covers (a field of the body): a time read
	// from an unsigned header would stop nothing. It runs only on an
	// authentic request. Default: none, and no tolerance check.
	Timestamp func(r *http.Request, body []byte) (time.Time, error)
	// Tolerance is how far Timestamp may be from now, either way. Default:
	// DefaultTolerance.
	Tolerance time.Duration
}

// GitHub returns the verifier of GitHub's webhooks: X-Hub-Signature-256
// holds "sha256=" and the hex HMAC-SHA256 of the body under the webhook's
// secret. Their event id is the X-GitHub-Delivery header (EventIDHeader).
func GitHub(secrets ...[]byte) *BodyHMAC {
	return &BodyHMAC{Header: "X-Hub-Signature-256", Prefix: "sha256=", Secrets: secrets}
}

// Verify implements Verifier.
func (v *BodyHMAC) Verify(r *http.Request, body []byte, now time.Time) error {
	value, err := signatureHeader(r.Header, v.Header)
	if err != nil {
		return err
	}
	enc, ok := strings.CutPrefix(value, v.Prefix)
	if !ok {
		return fmt.Errorf("%w: %s does not start with %q", ErrSignatureInvalid, v.Header, v.Prefix)
	}
	var sig []byte
	if v.Base64 {
		sig, err = base64.StdEncoding.DecodeString(enc)
	} else {
		sig, err = hex.DecodeString(enc)
	}
	if err != nil || !anyMatch(v.Secrets, [][]byte{sig}, nil, body) {
		return fmt.Errorf("%w: %s does not match the body", ErrSignatureInvalid, v.Header)
	}
	if v.Timestamp == nil {
		return nil
	}
	t, err := v.Timestamp(r, body)
	if err != nil {
		return fmt.Errorf("%w: no send time in the signed request: %w", ErrSignatureInvalid, err)
	}
	return withinTolerance(t, now, v.Tolerance)
}

// Sign returns the header value a provider would send for body, signed
// with the first secret.
func (v *BodyHMAC) Sign(body []byte) string {
	sum := mac(firstSecret(v.Secrets), nil, body)
	if v.Base64 {
		return v.Prefix + base64.StdEncoding.EncodeToString(sum)
	}
	return v.Prefix + hex.EncodeToString(sum)
}

func (v *BodyHMAC) validate() error { return validateHMAC(v.Header, v.Secrets, v.Tolerance) }

// validateHMAC checks a built-in verifier's settings: a verifier without a
// secret must never be mistaken for one that checks.
func validateHMAC(header string, secrets [][]byte, tolerance time.Duration) error {
	switch {
	case header == "":
		return errors.New("no Header")
	case len(secrets) == 0:
		return errors.New("no Secrets")
	case tolerance < 0:
		return errors.New("negative Tolerance")
	}
	for i, s := range secrets {
		if len(s) == 0 {
			return fmt.Errorf("secret %d is empty", i)
		}
	}
	return nil
}

// signatureHeader returns the one value of header name.
func signatureHeader(h http.Header, name string) (string, error) {
	vs := h.Values(name)
	switch {
	case len(vs) == 0 || strings.TrimSpace(vs[0]) == "":
		return "", fmt.Errorf("%w: no %s header", ErrSignatureMissing, name)
	case len(vs) > 1:
		return "", fmt.Errorf("%w: %d %s headers", ErrSignatureInvalid, len(vs), name)
	}
	return vs[0], nil
}

// anyMatch reports whether one of sigs is HMAC-SHA256(secret, prefix+body)
// under one of secrets, comparing in constant time.
func anyMatch(secrets, sigs [][]byte, prefix, body []byte) bool {
	ok := false
	for _, s := range secrets {
		want := mac(s, prefix, body)
		for _, sig := range sigs {
			if hmac.Equal(want, sig) {
				ok = true // no early return: every comparison runs
			}
		}
	}
	return ok
}

func mac(secret, prefix, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(prefix)
	h.Write(body)
	return h.Sum(nil)
}

func firstSecret(secrets [][]byte) []byte {
	if len(secrets) == 0 || len(secrets[0]) == 0 {
		panic("httpinbox: Sign needs a secret")
	}
	return secrets[0]
}

// unixSeconds parses a signed timestamp: decimal seconds since 1970.
func unixSeconds(s string) (time.Time, error) {
	if s == "" || len(s) > 12 || strings.TrimLeft(s, "0123456789") != "" {
		return time.Time{}, fmt.Errorf("timestamp %q is not unix seconds", s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(n, 0), nil
}

// withinTolerance checks a signed time against now.
func withinTolerance(t, now time.Time, tolerance time.Duration) error {
	if tolerance == 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(t); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed at %s, %s from now (tolerance %s)", ErrSignatureStale,
			t.UTC().Format(time.RFC3339), d.Round(time.Second), tolerance)
	}
	return nil
}
