package main

// The command line (./run.sh release runs it):
//
//	go run ./internal/release -version 0.4.0 -commit SHA [-epoch SECONDS] [-src .] [-out dist] [-arch amd64,arm64]
//
// -epoch defaults to $SOURCE_DATE_EPOCH (the commit's time, as run.sh
// passes it). Exit 0 on success, 1 on a failed build or write, 2 on bad
// flags.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv("SOURCE_DATE_EPOCH"), os.Stderr))
}

func run(ctx context.Context, args []string, epochEnv string, stderr io.Writer) int {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	version := fs.String("version", "", "release version, e.g. 0.4.0 (required)")
	commit := fs.String("commit", "", "git commit of the source (required)")
	epoch := fs.String("epoch", epochEnv, "SOURCE_DATE_EPOCH: archive mtimes, Unix seconds (default $SOURCE_DATE_EPOCH)")
	src := fs.String("src", ".", "repository root")
	out := fs.String("out", "dist", "output directory")
	arch := fs.String("arch", "amd64,arm64", "comma-separated GOARCH list (GOOS is linux)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	secs, err := strconv.ParseInt(*epoch, 10, 64)
	if err != nil || secs <= 0 {
		fmt.Fprintf(stderr, "release: -epoch (or SOURCE_DATE_EPOCH) %q: want positive Unix seconds\n", *epoch)
		return 2
	}
	if *version == "" || *commit == "" {
		fmt.Fprintln(stderr, "release: -version and -commit are required")
		return 2
	}
	tracked, err := GitFiles(ctx, *src)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if tracked == nil {
		fmt.Fprintf(stderr, "[release] %s is not a git checkout: every file of README.md, BENCHMARKS.md, docs/ and deploy/ is packed\n", *src)
	}
	_, err = Build(ctx, Options{Src: *src, Out: *out, Version: *version, Commit: *commit,
		Epoch: time.Unix(secs, 0), Arches: strings.Split(*arch, ","), Tracked: tracked, Log: stderr})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}
