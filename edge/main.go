// Command edge is iop's gateway: it serves the OpenAI- and Anthropic-compatible
// HTTP API, queues requests per model group, leases providers on nodes that
// dial in over mutual TLS, and reports status on its admin listener.
//
//	edge -config edge.json          serve
//	edge -config edge.json -check   validate the config and exit 0 or 1
//	edge version                    print version, commit and Go version (also -version)
//	edge pki init -dir DIR [-trust-domain iop.local] -edge NAME -node NAME…
//	edge pki issue -dir DIR -node NAME
//	edge secrets init -key FILE
//	edge secrets set -store FILE -key FILE -slot NAME   < secret
//	edge secrets list -store FILE
//	edge secrets rm -store FILE -slot NAME
//	edge keys create|list|show|revoke|rotate|usage -config FILE …
//	edge tokens create|list|revoke -config EDGE_CONFIG …   join tokens for new nodes
//	edge nodes list|revoke -config EDGE_CONFIG …           enrolled nodes
//
// SIGINT/SIGTERM drain and exit 0; SIGHUP reloads the config (SPEC N2).
// A fatal config or credential error prints the message on stderr and exits 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"iop/internal/buildinfo"
	"iop/internal/edge"
	"iop/internal/edge/config"
	"iop/internal/edge/fleetcmd"
	"iop/internal/edge/keyscmd"
	"iop/internal/edge/pkicmd"
	"iop/internal/edge/secretscmd"
	"iop/internal/logbuf"
)

// version and commit are set at link time (-ldflags "-X main.version=…
// -X main.commit=…", ./run.sh release and build); buildinfo fills what is
// missing.
var version, commit string

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	info := buildinfo.Read("edge", version, commit)
	if len(args) > 0 && args[0] == "version" {
		fmt.Fprintln(stdout, info)
		return 0
	}
	if len(args) > 0 && args[0] == "pki" {
		return pkicmd.Main(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "secrets" {
		return secretscmd.Main(args[1:], stdin, stdout, stderr, time.Now)
	}
	if len(args) > 0 && args[0] == "keys" {
		return keyscmd.Main(args[1:], stdout, stderr, time.Now)
	}
	if len(args) > 0 && args[0] == "tokens" {
		return fleetcmd.Tokens(args[1:], stdout, stderr, time.Now)
	}
	if len(args) > 0 && args[0] == "nodes" {
		return fleetcmd.Nodes(args[1:], stdout, stderr, time.Now)
	}
	fs := flag.NewFlagSet("edge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "path of the edge config file (JSON)")
	check := fs.Bool("check", false, "validate the config and exit")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, info)
		return 0
	}
	if *cfgPath == "" {
		fmt.Fprintln(stderr, "edge: -config FILE is required (see README.md)")
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *check {
		warnings, err := edge.Check(cfg)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		for _, w := range warnings {
			fmt.Fprintln(stderr, "warning:", w)
		}
		fmt.Fprintf(stdout, "%s: ok\n", *cfgPath)
		return 0
	}
	// One write(2) carries many lines (SPEC A1); Close writes what is held
	// on every return, a Warn or Error line goes out at once (logbuf).
	logw := logbuf.New(stderr, 0, 0)
	defer logw.Close()
	logger := slog.New(logw.Handler(slog.NewJSONHandler(logw, nil)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reload := make(chan *config.Config)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				c, err := config.Load(*cfgPath)
				if err != nil {
					logger.Error("config reload rejected; keeping the running config", "err", err)
					continue
				}
				select {
				case reload <- c:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	if err := edge.Serve(ctx, cfg, edge.Options{Logger: logger, Version: info.Version, Reload: reload}); err != nil {
		logger.Error("edge stopped", "err", err)
		fmt.Fprintln(stderr, "edge:", err)
		return 1
	}
	return 0
}
