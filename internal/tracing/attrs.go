package tracing

import (
	"net"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// SchemaURL is the semantic-conventions schema the attributes of idem's
// spans and metrics follow; tracers and meters are created with it.
const SchemaURL = semconv.SchemaURL

// knownMethods are the methods http.request.method may hold as they are.
var knownMethods = map[string]attribute.KeyValue{
	http.MethodConnect: semconv.HTTPRequestMethodConnect,
	http.MethodDelete:  semconv.HTTPRequestMethodDelete,
	http.MethodGet:     semconv.HTTPRequestMethodGet,
	http.MethodHead:    semconv.HTTPRequestMethodHead,
	http.MethodOptions: semconv.HTTPRequestMethodOptions,
	http.MethodPatch:   semconv.HTTPRequestMethodPatch,
	http.MethodPost:    semconv.HTTPRequestMethodPost,
	http.MethodPut:     semconv.HTTPRequestMethodPut,
	http.MethodTrace:   semconv.HTTPRequestMethodTrace,
	"QUERY":            semconv.HTTPRequestMethodQuery,
}

// HTTPMethod returns the http.request.method attribute of method and the
// name the convention gives it in span names and metrics: method itself
// when the convention knows it, else "_OTHER", with the method kept in
// http.request.method_original (so a client cannot create unbounded
// attribute values).
func HTTPMethod(method string) (string, []attribute.KeyValue) {
	if kv, ok := knownMethods[method]; ok {
		return method, []attribute.KeyValue{kv}
	}
	return "_OTHER", []attribute.KeyValue{semconv.HTTPRequestMethodOther, semconv.HTTPRequestMethodOriginal(method)}
}

// ServerAddress returns server.address and server.port for hostport
// ("host" or "host:port"); defaultPort is the port when hostport names none
// (0: no server.port).
func ServerAddress(hostport string, defaultPort int) []attribute.KeyValue {
	host, port := hostport, defaultPort
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host = h
		if n, err := strconv.Atoi(p); err == nil {
			port = n
		}
	}
	if host == "" {
		return nil
	}
	kv := []attribute.KeyValue{semconv.ServerAddress(host)}
	if port > 0 {
		kv = append(kv, semconv.ServerPort(port))
	}
	return kv
}
