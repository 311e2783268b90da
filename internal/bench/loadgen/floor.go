package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/signal"
	"syscall"
	"time"
)

// cmdFloor runs the one-hop floor of the overhead benchmark: a stdlib
// httputil.ReverseProxy that forwards every request to -upstream without
// parsing it. Its Transport is http.DefaultTransport's with more idle
// connections per host (256, like the node's adapters keep 64), so the floor
// is not handicapped by the default of 2 at 2,000 RPS, and each request is
// served full duplex (see below). It runs until SIGINT or SIGTERM.
func cmdFloor(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:28081", "address to listen on")
	upstream := fs.String("upstream", "", "upstream base URL, e.g. http://127.0.0.1:28434")
	if err := fs.Parse(args); err != nil {
		return err
	}
	up, err := url.Parse(*upstream)
	if err != nil || up.Scheme == "" || up.Host == "" {
		return fmt.Errorf("-upstream %q is not an absolute URL", *upstream)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 256
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(up) },
		Transport: tr,
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	// Full duplex: without it the HTTP/1 server takes the request body away
	// when the proxy writes the response headers, and the Transport's
	// request writer, racing to read that body's EOF, fails and closes the
	// upstream connection mid-stream (about 5% of 100-chunk streams cut
	// short on this machine, "use of closed network connection").
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "floor: %s -> %s\n", ln.Addr(), up)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
