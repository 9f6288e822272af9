package testbroker

import (
	"net"
	"testing"
)

// SilentAddr returns the address of a listener that accepts TCP
// connections and never answers, as a frozen or blackholed node does; it
// closes with the test.
func SilentAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testbroker: silent listener: %v", err)
	}
	tb.Cleanup(func() { _ = l.Close() })
	go func() { // owned by the test: ends when the listener closes
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return l.Addr().String()
}
