//go:build !linux

package pgnodes

import "syscall"

// setUserTimeout does nothing where TCP_USER_TIMEOUT is not set: the
// keepalives alone bound a connection to a vanished peer.
func setUserTimeout(string, string, syscall.RawConn) error { return nil }
