package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Who may enter, and how a form proves it came from the console.
//
//   - Without authentication (no Authenticate, BasicAuth or Tokens) the
//     console answers only requests that arrived on a loopback address,
//     from a loopback address, naming a loopback host (so that a page of
//     another site whose name resolves to 127.0.0.1 cannot read it), and
//     not forwarded by a proxy. Config.Operator acts.
//   - Otherwise the operator is who authenticated: Authenticate's answer, a
//     token's name (from the Authorization header, or the session cookie
//     the sign-in page sets), a basic-auth user. Never a form field.
//   - Every POST passes net/http's cross-origin protection (Sec-Fetch-Site,
//     Origin) and carries a token bound to the browser's CSRF cookie and to
//     the operator, except a request authenticated by its own
//     Authorization: Bearer header, which a browser never sends by itself.

// session is who is acting, and the CSRF token their forms carry.
type session struct {
	operator string
	csrf     string
	bearer   bool // authenticated by an Authorization: Bearer header
}

// handler is a screen or an action, for an authenticated operator.
type handler func(w http.ResponseWriter, r *http.Request, s *session)

// Cookie names.
const (
	csrfCookie    = "idem_console_csrf"
	sessionCookie = "idem_console_session"
)

// sessionLife is how long a token's sign-in lasts.
const sessionLife = 12 * time.Hour

// maxForm bounds a form's body.
const maxForm = 1 << 20

// guard authenticates the request, enforces read-only and CSRF on POST,
// then runs h.
func (c *Console) guard(h handler) http.Handler {
	return c.cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.cfg.authenticated() {
			if why := notLoopback(r); why != "" {
				c.refuse(w, r, http.StatusForbidden, "the console has no authentication configured, so it answers only on loopback: "+why)
				return
			}
		}
		s, ok := c.authenticate(r)
		if !ok {
			c.challenge(w, r)
			return
		}
		s.csrf = c.csrfToken(w, r, s.operator)
		if r.Method == http.MethodPost {
			if c.cfg.ReadOnly {
				c.refuse(w, r, http.StatusForbidden, "the console is read-only: it takes no action")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if err := r.ParseForm(); err != nil {
				c.refuse(w, r, http.StatusBadRequest, "unreadable form: "+err.Error())
				return
			}
			if !s.bearer && !c.validCSRF(r, s.operator) {
				c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or stale: reload the page and try again")
				return
			}
		}
		h(w, r, s)
	}))
}

// authenticate returns who sends r, and whether they may enter.
func (c *Console) authenticate(r *http.Request) (*session, bool) {
	cfg := c.cfg
	if !cfg.authenticated() {
		return &session{operator: cfg.Operator}, true
	}
	if cfg.Authenticate != nil {
		if op, ok := cfg.Authenticate(r); ok && strings.TrimSpace(op) != "" {
			return &session{operator: op}, true
		}
	}
	if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		if op, ok := c.tokenOperator(strings.TrimSpace(t)); ok {
			return &session{operator: op, bearer: true}, true
		}
		return nil, false
	}
	if user, pass, ok := r.BasicAuth(); ok && len(cfg.BasicAuth) > 0 {
		want, known := cfg.BasicAuth[user]
		if known && subtle.ConstantTimeCompare([]byte(pass), []byte(want)) == 1 {
			return &session{operator: user}, true
		}
		return nil, false
	}
	if op, ok := c.signedIn(r); ok {
		return &session{operator: op}, true
	}
	return nil, false
}

// tokenOperator returns the operator whose token is t, comparing with
// every token in constant time.
func (c *Console) tokenOperator(t string) (string, bool) {
	found := ""
	for name, secret := range c.cfg.Tokens {
		if subtle.ConstantTimeCompare([]byte(t), []byte(secret)) == 1 {
			found = name
		}
	}
	return found, found != ""
}

// challenge answers a request that did not authenticate: the sign-in page
// for tokens, a basic-auth challenge, or a plain refusal.
func (c *Console) challenge(w http.ResponseWriter, r *http.Request) {
	if len(c.cfg.Tokens) > 0 && r.Method == http.MethodGet && r.Header.Get("Authorization") == "" {
		http.Redirect(w, r, c.cfg.Prefix+"/login?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
		return
	}
	if len(c.cfg.BasicAuth) > 0 {
		w.Header().Set("WWW-Authenticate", `Basic realm="idem console", charset="UTF-8"`)
	}
	c.refuse(w, r, http.StatusUnauthorized, "sign in first")
}

// notLoopback says why r may not be served without authentication, or ""
// when it may: it arrived on and from loopback, names a loopback host and
// was not forwarded.
func notLoopback(r *http.Request) string {
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && !loopbackHost(local.String()) {
		return fmt.Sprintf("it listens on %s", local)
	}
	if !loopbackHost(r.RemoteAddr) {
		return fmt.Sprintf("the request came from %s", r.RemoteAddr)
	}
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Real-Ip"} {
		if r.Header.Get(h) != "" {
			return "a proxy forwarded the request (" + h + ")"
		}
	}
	if !loopbackHost(r.Host) {
		return fmt.Sprintf("the request names host %q, not a loopback name", r.Host)
	}
	return ""
}

// loopbackHost reports whether hostport (a host, with or without a port)
// is localhost or a loopback address.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LoopbackAddr reports whether a listen address such as "127.0.0.1:8080"
// or "[::1]:0" binds loopback only. ":8080" and "0.0.0.0:8080" do not: they
// listen on every interface. Whoever serves the console without
// authentication should refuse such an address before listening, as
// `idem console` does; the console refuses the requests anyway.
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	return loopbackHost(host)
}

// mac signs the parts with the console's key.
func (c *Console) mac(parts ...string) []byte {
	h := hmac.New(sha256.New, c.key)
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}

// csrfToken returns the token forms carry for operator, from the browser's
// CSRF cookie, which it sets first when the browser has none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request, operator string) string {
	seed := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) >= 22 {
		seed = ck.Value
	} else {
		b := make([]byte, 24)
		_, _ = rand.Read(b) // crypto/rand never fails on supported platforms
		seed = base64.RawURLEncoding.EncodeToString(b)
		http.SetCookie(w, c.cookie(csrfCookie, seed, 0, r))
	}
	return base64.RawURLEncoding.EncodeToString(c.mac("csrf", seed, operator))
}

// validCSRF reports whether r's form carries the token of its CSRF cookie
// and operator.
func (c *Console) validCSRF(r *http.Request, operator string) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(r.PostForm.Get("csrf"))
	return err == nil && hmac.Equal(got, c.mac("csrf", ck.Value, operator))
}

// cookie returns a cookie of the console's path, unreadable by scripts and
// never sent by another site; a session cookie when life is zero.
func (c *Console) cookie(name, value string, life time.Duration, r *http.Request) *http.Cookie {
	ck := &http.Cookie{Name: name, Value: value, Path: c.cfg.Prefix + "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil}
	if life > 0 {
		ck.MaxAge = int(life.Seconds())
	}
	return ck
}

// signedIn returns the operator of r's session cookie, set by login.
func (c *Console) signedIn(r *http.Request) (string, bool) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil || len(c.cfg.Tokens) == 0 {
		return "", false
	}
	parts := strings.Split(ck.Value, ".")
	if len(parts) != 3 {
		return "", false
	}
	name, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	sig, err2 := base64.RawURLEncoding.DecodeString(parts[2])
	until, err3 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || time.Now().Unix() > until {
		return "", false
	}
	if !hmac.Equal(sig, c.mac("session", string(name), parts[1])) {
		return "", false
	}
	if _, still := c.cfg.Tokens[string(name)]; !still {
		return "", false
	}
	return string(name), true
}

// loginPage shows the token sign-in form.
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if len(c.cfg.Tokens) == 0 {
		c.refuse(w, r, http.StatusNotFound, "this console has no token sign-in")
		return
	}
	s := &session{csrf: c.csrfToken(w, r, "")}
	c.render(w, r, s, http.StatusOK, "login", "Sign in", loginData{Next: safeNext(r.URL.Query().Get("next"))})
}

// loginData is the sign-in page.
type loginData struct {
	Next  string
	Error string
}

// login checks a token and sets the session cookie.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if len(c.cfg.Tokens) == 0 {
		c.refuse(w, r, http.StatusNotFound, "this console has no token sign-in")
		return
	}
	if err := c.cop.Check(r); err != nil {
		c.refuse(w, r, http.StatusForbidden, "cross-origin sign-in refused")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil || !c.validCSRF(r, "") {
		c.refuse(w, r, http.StatusForbidden, "the form's CSRF token is missing or stale: reload the page and try again")
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	op, ok := c.tokenOperator(r.PostForm.Get("token"))
	if !ok {
		s := &session{csrf: c.csrfToken(w, r, "")}
		c.render(w, r, s, http.StatusUnauthorized, "login", "Sign in", loginData{Next: next, Error: "unknown token"})
		return
	}
	until := strconv.FormatInt(time.Now().Add(sessionLife).Unix(), 10)
	value := base64.RawURLEncoding.EncodeToString([]byte(op)) + "." + until + "." +
		base64.RawURLEncoding.EncodeToString(c.mac("session", op, until))
	http.SetCookie(w, c.cookie(sessionCookie, value, sessionLife, r))
	c.cfg.Logger.Info("console: signed in", "operator", op)
	http.Redirect(w, r, c.cfg.Prefix+next, http.StatusSeeOther)
}

// safeNext keeps a path inside the console: "/" unless next is a path of
// it, never another site ("//host", "/\host").
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/"
	}
	return next
}
