package lab

import (
	"fmt"
	"io"
	"net"
	"time"
)

// ForwardInto listens on addr (host:port) inside ns and relays every
// connection to the same addr in the caller's own namespace: it makes a
// server on the host's loopback (the API server rig) reachable from a node
// namespace under the same address, so that its certificate's 127.0.0.1
// SAN stays valid there. Close the listener to stop it.
func ForwardInto(ns *NS, addr string) (net.Listener, error) {
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("forwarder in %s: %w", ns.Name, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go relay(c, addr)
		}
	}()
	return ln, nil
}

func relay(c net.Conn, addr string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return // server down: the client sees its connection closed
	}
	defer up.Close()
	go func() {
		_, _ = io.Copy(up, c)
		up.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(c, up)
}
