// Package fleetcmd implements the "edge tokens" and "edge nodes"
// subcommands (SPEC J1, J6): join tokens for new nodes, and the list and
// revocation of enrolled nodes. Every command takes the edge's config
// (-config EDGE_CONFIG) and works on its enrollment store, which a
// running edge re-reads within a fraction of a second.
//
// It owns flag parsing and reporting only; the store and its decisions
// live in internal/edge/fleet. It prints a token exactly once, on
// creation, never keeps its secret (only the SHA-256), never reads the
// environment and never calls os.Exit: the Main functions return the exit
// code.
package fleetcmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"iop/internal/edge/config"
	"iop/internal/edge/fleet"
	"iop/internal/identity"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1 // unreadable config or store, refused operation
	ExitUsage = 2 // bad subcommand or flags
)

// Bounds of edge tokens create.
const (
	MaxTokenTTL  = 30 * 24 * time.Hour
	MinTokenTTL  = time.Minute
	MaxTokenUses = 10000
)

const tokensUsage = `usage:
  edge tokens create -config EDGE_CONFIG [-node NAME | -prefix PREFIX] [-ttl 1h] [-uses 1]
                     [-edge HOST:PORT] [-dir DIR]
      prints the one line to run on the new host: node join -edge … -token … -dir …
  edge tokens list   -config EDGE_CONFIG
  edge tokens revoke -config EDGE_CONFIG ID
`

const nodesUsage = `usage:
  edge nodes list   -config EDGE_CONFIG
  edge nodes revoke -config EDGE_CONFIG NAME
      the running edge disconnects the node within a second and refuses its
      certificate; it can join again with a new token
`

// Tokens runs "edge tokens <create|list|revoke>"; args are the words after
// "tokens". now stamps and checks times.
func Tokens(args []string, stdout, stderr io.Writer, now func() time.Time) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "edge tokens: missing subcommand\n"+tokensUsage)
		return ExitUsage
	}
	switch args[0] {
	case "create":
		return tokensCreate(args[1:], stdout, stderr, now)
	case "list":
		return withStore("tokens list", tokensUsage, args[1:], 0, stderr, func(cfg *config.Config, _ []string) int {
			return tokensList(cfg, stdout, stderr, now())
		})
	case "revoke":
		return withStore("tokens revoke", tokensUsage, args[1:], 1, stderr, func(cfg *config.Config, rest []string) int {
			return change(stderr, stdout, "tokens revoke", cfg, func(st *fleet.Store) (string, error) {
				if st.Token(rest[0]) == nil {
					return "", fmt.Errorf("no token %q (edge tokens list shows them)", rest[0])
				}
				if !st.RevokeToken(rest[0], now()) {
					return "token " + rest[0] + " was already revoked", nil
				}
				return "token " + rest[0] + " revoked", nil
			})
		})
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, tokensUsage)
		return ExitOK
	}
	fmt.Fprintf(stderr, "edge tokens: unknown subcommand %q\n%s", args[0], tokensUsage)
	return ExitUsage
}

// Nodes runs "edge nodes <list|revoke>".
func Nodes(args []string, stdout, stderr io.Writer, now func() time.Time) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "edge nodes: missing subcommand\n"+nodesUsage)
		return ExitUsage
	}
	switch args[0] {
	case "list":
		return withStore("nodes list", nodesUsage, args[1:], 0, stderr, func(cfg *config.Config, _ []string) int {
			return nodesList(cfg, stdout, stderr)
		})
	case "revoke":
		return withStore("nodes revoke", nodesUsage, args[1:], 1, stderr, func(cfg *config.Config, rest []string) int {
			return change(stderr, stdout, "nodes revoke", cfg, func(st *fleet.Store) (string, error) {
				if err := identity.ValidateName(rest[0]); err != nil {
					return "", err
				}
				// SPEC J6: a name this edge would never admit (a typo) is not
				// "revoked", which would leave the node meant still connected.
				if st.Node(rest[0]) == nil && cfg.NodeByID(rest[0]) == nil {
					return "", fmt.Errorf("no node %q has joined this edge or is listed in its config's nodes[] (edge nodes list shows the joined ones); nothing revoked", rest[0])
				}
				if !st.RevokeNode(rest[0], now()) {
					return "node " + rest[0] + " was already revoked", nil
				}
				return "node " + rest[0] + " revoked: a running edge disconnects it within a second and refuses its certificate", nil
			})
		})
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, nodesUsage)
		return ExitOK
	}
	fmt.Fprintf(stderr, "edge nodes: unknown subcommand %q\n%s", args[0], nodesUsage)
	return ExitUsage
}

// withStore parses -config and exactly nargs positional arguments, loads
// the config and runs fn.
func withStore(cmd, usage string, args []string, nargs int, stderr io.Writer, fn func(*config.Config, []string) int) int {
	fs := newFlagSet(cmd, usage, stderr)
	cfgPath := fs.String("config", "", "the edge's config file")
	if err := fs.Parse(args); err != nil {
		return parseCode(err)
	}
	rest := fs.Args()
	if len(rest) != nargs {
		fmt.Fprintf(stderr, "edge %s: want %d argument(s), got %d\n%s", cmd, nargs, len(rest), usage)
		return ExitUsage
	}
	cfg, code := loadConfig(cmd, *cfgPath, usage, stderr)
	if cfg == nil {
		return code
	}
	return fn(cfg, rest)
}

func newFlagSet(cmd, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("edge "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	return fs
}

func parseCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	return ExitUsage
}

func loadConfig(cmd, path, usage string, stderr io.Writer) (*config.Config, int) {
	if path == "" {
		fmt.Fprintf(stderr, "edge %s: missing -config EDGE_CONFIG\n%s", cmd, usage)
		return nil, ExitUsage
	}
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintf(stderr, "edge %s: %v\n", cmd, err)
		return nil, ExitError
	}
	return cfg, ExitOK
}

// change rewrites the store under its lock with fn and prints fn's line.
func change(stderr, stdout io.Writer, cmd string, cfg *config.Config, fn func(*fleet.Store) (string, error)) int {
	var line string
	err := fleet.Update(cfg.Enrollment.StoreFile, func(st *fleet.Store) error {
		var err error
		line, err = fn(st)
		return err
	})
	if err != nil {
		fmt.Fprintf(stderr, "edge %s: %v\n", cmd, err)
		return ExitError
	}
	fmt.Fprintln(stdout, line)
	return ExitOK
}

func tokensCreate(args []string, stdout, stderr io.Writer, now func() time.Time) int {
	fs := newFlagSet("tokens create", tokensUsage, stderr)
	cfgPath := fs.String("config", "", "the edge's config file")
	node := fs.String("node", "", "the one node name the token allows")
	prefix := fs.String("prefix", "", "allow the node names starting with PREFIX")
	ttl := fs.Duration("ttl", time.Hour, "how long the token can be used")
	uses := fs.Int("uses", 1, "how many nodes may join with it")
	edgeAddr := fs.String("edge", "", "host:port the new host dials (default: the config's node_listen)")
	dir := fs.String("dir", "", "the directory the printed node join writes (default: the node's name, or iop-node)")
	if err := fs.Parse(args); err != nil {
		return parseCode(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "edge tokens create: unexpected argument %q\n%s", fs.Arg(0), tokensUsage)
		return ExitUsage
	}
	var bad []string
	switch {
	case *node != "" && *prefix != "":
		bad = append(bad, "-node and -prefix exclude each other")
	case *node != "" && !fleet.ValidNodeName(*node):
		bad = append(bad, fmt.Sprintf("-node %q: a node name is 1-63 of letters, digits, '.', '_', '-', starting with a letter or digit", *node))
	case *prefix != "" && !fleet.ValidNodeName(*prefix):
		bad = append(bad, fmt.Sprintf("-prefix %q: a node name's start, 1-63 of letters, digits, '.', '_', '-', starting with a letter or digit (no name could join with it)", *prefix))
	}
	if *ttl < MinTokenTTL || *ttl > MaxTokenTTL {
		bad = append(bad, fmt.Sprintf("-ttl %v: want between %v and %v", *ttl, MinTokenTTL, MaxTokenTTL))
	}
	if *uses < 1 || *uses > MaxTokenUses {
		bad = append(bad, fmt.Sprintf("-uses %d: want between 1 and %d", *uses, MaxTokenUses))
	}
	if len(bad) > 0 {
		fmt.Fprintf(stderr, "edge tokens create: %s\n%s", strings.Join(bad, "; "), tokensUsage)
		return ExitUsage
	}
	cfg, code := loadConfig("tokens create", *cfgPath, tokensUsage, stderr)
	if cfg == nil {
		return code
	}
	if !cfg.Enrollment.Enabled() {
		fmt.Fprintf(stderr, "edge tokens create: enrollment is off in %s: set enrollment.ca_key_file (the CA key the edge signs joining nodes with; see docs/operating.md)\n", *cfgPath)
		return ExitError
	}
	if *node != "" && cfg.NodeByID(*node) != nil {
		fmt.Fprintf(stderr, "edge tokens create: node %q is listed in nodes[] of %s: it uses a certificate from edge pki\n", *node, *cfgPath)
		return ExitError
	}
	if *node != "" && cfg.TemplateFor(*node) == nil {
		fmt.Fprintf(stderr, "edge tokens create: no node_templates entry of %s matches %q: its join would be refused\n", *cfgPath, *node)
		return ExitError
	}
	ca, err := identity.LoadCA(cfg.TLS.CAFile, cfg.Enrollment.CAKeyFile)
	if err != nil {
		fmt.Fprintf(stderr, "edge tokens create: %v\n", err)
		return ExitError
	}
	tok, err := identity.NewJoinToken(identity.CAPin(ca.Cert))
	if err != nil {
		fmt.Fprintf(stderr, "edge tokens create: %v\n", err)
		return ExitError
	}
	tok.Node = *node // J1: node join without -name joins as the token's node
	t := now()
	rec := &fleet.Token{ID: tok.ID, SecretSHA256: tok.SecretSHA256(), Node: *node, Prefix: *prefix,
		CreatedAt: t.UTC(), ExpiresAt: t.Add(*ttl).UTC(), Uses: *uses}
	if err := fleet.Update(cfg.Enrollment.StoreFile, func(st *fleet.Store) error {
		st.Prune(t)
		st.Tokens = append(st.Tokens, rec)
		return nil
	}); err != nil {
		fmt.Fprintf(stderr, "edge tokens create: %v\n", err)
		return ExitError
	}
	addr := *edgeAddr
	if addr == "" {
		addr = advertised(cfg.NodeListen)
	}
	d := *dir
	if d == "" {
		d = "iop-node"
		if *node != "" {
			d = *node
		}
	}
	fmt.Fprintf(stdout, "node join -edge %s -token %s -dir %s\n", addr, tok, d)
	fmt.Fprintf(stderr, "token %s: %s, %d use(s), expires %s; run the line above on the new host (it is shown once)\n",
		tok.ID, rec.Scope(), rec.Uses, rec.ExpiresAt.Format(time.RFC3339))
	return ExitOK
}

// advertised is node_listen as a remote host dials it: a wildcard host
// becomes this host's name.
func advertised(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	switch host {
	case "", "0.0.0.0", "::":
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

func tokensList(cfg *config.Config, stdout, stderr io.Writer, now time.Time) int {
	st, err := fleet.LoadStore(cfg.Enrollment.StoreFile)
	if err != nil {
		fmt.Fprintf(stderr, "edge tokens list: %v\n", err)
		return ExitError
	}
	if len(st.Tokens) == 0 {
		fmt.Fprintln(stdout, "no tokens")
		return ExitOK
	}
	fmt.Fprintf(stdout, "%-16s  %-24s  %-9s  %-8s  %-20s  %s\n", "ID", "SCOPE", "USES", "STATE", "EXPIRES", "JOINED")
	for _, t := range st.Tokens {
		fmt.Fprintf(stdout, "%-16s  %-24s  %-9s  %-8s  %-20s  %s\n", t.ID, t.Scope(), fmt.Sprintf("%d/%d", t.Used, t.Uses),
			t.State(now), t.ExpiresAt.UTC().Format(time.RFC3339), strings.Join(t.Joined, ","))
	}
	return ExitOK
}

func nodesList(cfg *config.Config, stdout, stderr io.Writer) int {
	st, err := fleet.LoadStore(cfg.Enrollment.StoreFile)
	if err != nil {
		fmt.Fprintf(stderr, "edge nodes list: %v\n", err)
		return ExitError
	}
	if len(st.Nodes) == 0 {
		fmt.Fprintln(stdout, "no enrolled or revoked nodes")
		return ExitOK
	}
	fmt.Fprintf(stdout, "%-24s  %-8s  %-20s  %-20s  %s\n", "NODE", "STATE", "CERT EXPIRES", "ENROLLED", "RENEWED")
	for _, n := range st.Nodes {
		state, renewed := "enrolled", "-"
		if n.RevokedAt != nil {
			state = "revoked"
		}
		if n.RenewedAt != nil {
			renewed = n.RenewedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(stdout, "%-24s  %-8s  %-20s  %-20s  %s\n", n.Name, state, fmtTime(n.NotAfter), fmtTime(n.EnrolledAt), renewed)
	}
	return ExitOK
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
