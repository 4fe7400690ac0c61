package healthcheck

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestServerBounded: idle or half-sent connections take at most MaxConns
// slots and lose them at the header deadline; the server then answers
// again.
func TestServerBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	go Serve(srv, ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/healthz"
	get := func(timeout time.Duration) error {
		c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := get(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range MaxConns {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")) // never finished
		held = append(held, c)
	}
	time.Sleep(200 * time.Millisecond)
	if err := get(time.Second); err == nil {
		t.Fatalf("served beside %d held connections", MaxConns)
	}
	start := time.Now()
	for get(time.Second) != nil {
		if time.Since(start) > 3*readHeaderTimeout {
			t.Fatalf("still not served %v after the held connections' header deadline", time.Since(start))
		}
	}
	t.Logf("served again %v later", time.Since(start).Round(100*time.Millisecond))
}
