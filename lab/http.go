package lab

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// HTTPGet does an HTTP GET from inside ns: the agent's servers listen in
// the node's namespace, and net/http would dial from the caller's. It
// returns the status, the headers and the body.
func HTTPGet(ns *NS, url string) (int, http.Header, string, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := ns.Do(func() (err error) {
				conn, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}}}
	resp, err := c.Get(url)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b), err
}
