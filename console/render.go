package console

import (
	"bytes"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/safetext"
)

// Every value on a page goes through html/template, which escapes it for
// where it stands (text, attribute, URL), and the text a producer or a
// handler wrote (ids, reasons, errors, keys) goes through show first,
// which writes what is not printable as Go escapes (\x1b, \u202e): a
// message id can neither add markup nor hide itself. The pages carry no
// script at all, and the Content-Security-Policy allows none.

//go:embed templates/*.html static/console.css
var assets embed.FS

// contentSecurityPolicy allows the console's own stylesheet and forms, and
// nothing else: no script, no frame, no image from elsewhere.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'"

// secure sets the headers every answer carries.
func secure(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

func serveCSS(w http.ResponseWriter, _ *http.Request) {
	b, _ := assets.ReadFile("static/console.css") // embedded: always there
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(b)
}

// pageNames are the templates, each rendered inside layout.html.
var pageNames = []string{"error", "login", "overview", "deadletters", "deadletter", "ledger", "effect",
	"actions", "http", "httpkey", "httpoperation", "replays", "partitions"}

// pages holds the parsed templates by name.
type pages struct{ byName map[string]*template.Template }

func parsePages() (*pages, error) {
	p := &pages{byName: map[string]*template.Template{}}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
		p.byName[name] = t
	}
	return p, nil
}

// view is what every page gets: the layout's values and the page's own.
type view struct {
	Title        string
	Page         string
	Prefix       string
	Operator     string
	ReadOnly     bool
	CanAct       bool // an operator is signed in and the console is not read-only
	ShowPayloads bool
	CSRF         string
	Data         any
}

// render writes the page name with status.
func (c *Console) render(w http.ResponseWriter, r *http.Request, s *session, status int, name, title string, data any) {
	v := view{Title: title, Page: name, Prefix: c.cfg.Prefix, ReadOnly: c.cfg.ReadOnly,
		ShowPayloads: c.cfg.ShowPayloads, Data: data}
	if s != nil {
		v.Operator, v.CSRF = s.operator, s.csrf
		v.CanAct = s.operator != "" && !c.cfg.ReadOnly
	}
	var buf bytes.Buffer
	if err := c.pages.byName[name].Execute(&buf, v); err != nil {
		c.cfg.Logger.Error("console: render", "page", name, "error", err)
		http.Error(w, "console: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// refuse answers with an error page saying why.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	c.render(w, r, nil, status, "error", http.StatusText(status), why)
}

// fail answers a request whose reading failed.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	c.cfg.Logger.Error("console: page failed", "path", r.URL.Path, "error", err)
	c.refuse(w, r, http.StatusInternalServerError, err.Error())
}

var funcs = template.FuncMap{
	"show":  show,
	"short": func(s string, n int) string { return safetext.Abbreviate(show(s), n) },
	"stamp": stamp,
	"ago":   ago,
	"num":   num,
	"text":  text,
}

// text is a stored body as text when it is UTF-8, else as hex.
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return "hex: " + hex.EncodeToString(b)
}

// show is text from outside, printable: what is not is written as Go
// escapes.
func show(v any) string {
	switch x := v.(type) {
	case string:
		return safetext.Display(x)
	case fmt.Stringer:
		return safetext.Display(x.String())
	case error:
		return safetext.Display(x.Error())
	}
	return safetext.Display(fmt.Sprint(v))
}

// stamp is t in UTC to the second, "-" when zero.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago is how long ago t was, roughly.
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Since(t)
	prefix, suffix := "", " ago"
	if d < 0 {
		d, prefix, suffix = -d, "in ", ""
	}
	switch {
	case d < time.Minute:
		return prefix + strconv.Itoa(int(d.Seconds())) + "s" + suffix
	case d < time.Hour:
		return prefix + strconv.Itoa(int(d.Minutes())) + "m" + suffix
	case d < 48*time.Hour:
		return prefix + strconv.Itoa(int(d.Hours())) + "h" + suffix
	}
	return prefix + strconv.Itoa(int(d.Hours()/24)) + "d" + suffix
}

// num writes n with thousands separators.
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
