// Command node is iop's agent on an inference host. It dials out to the edge
// over mutual TLS (so it may sit behind NAT), registers, receives its adapter
// config, says ready and executes requests against local backends.
//
//	node -config node.json          run until SIGINT/SIGTERM
//	node -config node.json -check   validate the config and exit 0 or 1
//	node version                    print version, commit and Go version (also -version)
//	node join -edge HOST:PORT -token TOKEN -dir DIR [-name NAME]
//	                                        join the edge with a token from `edge tokens create`
//
// Exit codes (SPEC S4): 0 on SIGINT/SIGTERM; 1 when reconnect attempts are
// exhausted or on a fatal local config or credential error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"iop/internal/buildinfo"
	"iop/internal/logbuf"
	"iop/internal/node"
	"iop/internal/node/config"
	"iop/internal/node/enroll"
)

// version and commit are set at link time (-ldflags "-X main.version=…
// -X main.commit=…", ./run.sh release and build); buildinfo fills what is
// missing.
var version, commit string

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	info := buildinfo.Read("node", version, commit)
	if len(args) > 0 && args[0] == "version" {
		fmt.Fprintln(stdout, info)
		return 0
	}
	if len(args) > 0 && args[0] == "join" {
		return join(args[1:], stdout, stderr, info.Version)
	}
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "path of the node config file (JSON)")
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
		fmt.Fprintln(stderr, "node: -config FILE is required (see README.md)")
		return 2
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if *check {
		if err := node.Check(cfg); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
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
	err = node.Run(ctx, cfg, node.Options{Logger: logger, Version: info.Version, LookupEnv: os.LookupEnv})
	if err != nil {
		logger.Error("node stopped", "err", err)
		fmt.Fprintln(stderr, "node:", err)
		return 1
	}
	return 0
}

// join runs `node join` (SPEC J1-J3): exit 0 when DIR holds a node that can
// start, 1 when the join failed (nothing written), 2 for bad flags.
func join(args []string, stdout, stderr io.Writer, version string) int {
	fs := flag.NewFlagSet("node join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	edge := fs.String("edge", "", "host:port of the edge's node_listen")
	token := fs.String("token", "", "the join token edge tokens create printed")
	dir := fs.String("dir", "", "directory to write (must not exist, or be empty)")
	name := fs.String("name", "", "node name to ask for (default: the token's node, for a token made with -node; else this host's name)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *edge == "" || *token == "" || *dir == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: node join -edge HOST:PORT -token TOKEN -dir DIR [-name NAME]")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := enroll.Join(ctx, enroll.JoinOptions{Edge: *edge, Token: *token, Dir: *dir, Name: *name, Version: version})
	if err != nil {
		fmt.Fprintln(stderr, "node join:", err)
		return 1
	}
	fmt.Fprintf(stdout, "joined edge %s as node %s (trust domain %s); certificate valid until %s, renewed by the node while it runs\n",
		res.Edge, res.Node, res.TrustDomain, res.NotAfter.UTC().Format(time.RFC3339))
	if !res.Credentials {
		fmt.Fprintln(stdout, "the edge sent no lease issuer key: node.json has no credentials (the edge's credential plane is off)")
	}
	fmt.Fprintf(stdout, "start it: node -config %s\n", res.ConfigPath)
	return 0
}
