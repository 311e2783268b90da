// Package pkicmd implements the "edge pki" subcommands, which write a
// development PKI for deployments without openssl (SPEC I1): a CA, edge and node certificates with SPIFFE URI SANs, the
// lease issuer key pair and each node's lease recipient key pair.
//
// It owns flag parsing and reporting only; generation lives in
// internal/identity. It must never print private key material, read the
// environment, or call os.Exit: Main returns the exit code.
package pkicmd

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"iop/internal/identity"
)

// Exit codes returned by Main.
const (
	ExitOK    = 0 // files written (or -h)
	ExitError = 1 // I/O error, unreadable CA, or a file exists without -force
	ExitUsage = 2 // bad subcommand, flags, or names
)

const usage = `usage:
  edge pki init   -dir DIR [-trust-domain iop.local] -edge NAME [-edge NAME ...] [-node NAME ...] [-force]
                  (no -node: the nodes join with tokens, see edge tokens)
  edge pki issue  -dir DIR -node NAME [-trust-domain TD] [-force]
  edge pki issue  -dir DIR -edge NAME [-force]    (another edge's certificate, signed by the same CA)
  edge pki issuer -dir DIR -name NAME [-force]    (a new lease issuer pair NAME.key/NAME.pub, for rotation)
`

// Main runs "edge pki <init|issue> flags..."; args are the words after
// "pki" (os.Args[2:]). It prints each file written and, per node, the
// lease_recipient_public_key line for the edge config to stdout, and
// errors to stderr. It returns ExitOK, ExitError or ExitUsage.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "edge pki: missing subcommand\n"+usage)
		return ExitUsage
	}
	switch args[0] {
	case "init":
		return runInit(args[1:], stdout, stderr)
	case "issuer":
		return runIssuer(args[1:], stdout, stderr)
	case "issue":
		return runIssue(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return ExitOK
	default:
		fmt.Fprintf(stderr, "edge pki: unknown subcommand %q\n%s", args[0], usage)
		return ExitUsage
	}
}

// names is a repeatable string flag.
type names []string

func (n *names) String() string     { return strings.Join(*n, ",") }
func (n *names) Set(v string) error { *n = append(*n, v); return nil }

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("edge pki "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	return fs
}

// parse runs fs.Parse and maps its outcome to an exit code; done reports
// whether the caller should return code at once.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK, true
		}
		return ExitUsage, true // the flag package already printed the error and usage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n%s", fs.Name(), fs.Arg(0), usage)
		return ExitUsage, true
	}
	return 0, false
}

func runInit(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("init", stderr)
	dir := fs.String("dir", "", "output directory (created 0700 if missing)")
	td := fs.String("trust-domain", identity.DefaultTrustDomain, "SPIFFE trust domain")
	var edgeNames names
	fs.Var(&edgeNames, "edge", "edge name (repeatable: several edges, one CA)")
	var nodes names
	fs.Var(&nodes, "node", "node id (repeatable)")
	force := fs.Bool("force", false, "overwrite existing files")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	var missing []string
	if *dir == "" {
		missing = append(missing, "-dir")
	}
	if len(edgeNames) == 0 {
		missing = append(missing, "-edge")
	}
	if len(missing) > 0 {
		fmt.Fprintf(stderr, "edge pki init: missing %s\n%s", strings.Join(missing, ", "), usage)
		return ExitUsage
	}
	err := identity.InitPKI(*dir, identity.PKIOptions{TrustDomain: *td, Edge: edgeNames[0], Edges: edgeNames[1:], Nodes: nodes, Force: *force})
	if err != nil {
		return fail(stderr, "edge pki init", err)
	}
	files := []string{identity.CACertFile, identity.CAKeyFile}
	for _, e := range edgeNames {
		files = append(files, identity.CertFileName(e), identity.KeyFileName(e))
	}
	for _, n := range nodes {
		files = append(files, nodeFiles(n)...)
	}
	files = append(files, identity.IssuerKeyFile, identity.IssuerPubFile)
	printFiles(stdout, *dir, files)

	issuer, err := identity.LoadIssuerPublicKey(filepath.Join(*dir, identity.IssuerPubFile))
	if err != nil {
		return fail(stderr, "edge pki init", err)
	}
	fmt.Fprintf(stdout, "\nlease issuer public key (node config credentials.issuer_public_key):\n  %s\n", identity.IssuerPublicKeyBase64(issuer))
	return printRecipients(stdout, stderr, "edge pki init", *dir, nodes)
}

func runIssue(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("issue", stderr)
	dir := fs.String("dir", "", "PKI directory holding ca.crt and ca.key")
	td := fs.String("trust-domain", "", "SPIFFE trust domain (default: the CA's)")
	var nodes names
	fs.Var(&nodes, "node", "node id")
	edgeName := fs.String("edge", "", "an edge's name: issue that edge's certificate instead")
	force := fs.Bool("force", false, "overwrite the node's existing files (rotation)")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	switch {
	case *dir == "":
		fmt.Fprint(stderr, "edge pki issue: missing -dir\n"+usage)
		return ExitUsage
	case *edgeName != "" && len(nodes) > 0:
		fmt.Fprint(stderr, "edge pki issue: -edge or -node, not both\n"+usage)
		return ExitUsage
	case *edgeName != "":
		if err := identity.IssueEdge(*dir, *edgeName, *force, nil); err != nil {
			return fail(stderr, "edge pki issue", err)
		}
		printFiles(stdout, *dir, []string{identity.CertFileName(*edgeName), identity.KeyFileName(*edgeName)})
		return ExitOK
	case len(nodes) != 1:
		fmt.Fprintf(stderr, "edge pki issue: want exactly one -node, got %d\n%s", len(nodes), usage)
		return ExitUsage
	}
	err := identity.IssueNode(*dir, identity.IssueOptions{Node: nodes[0], TrustDomain: *td, Force: *force})
	if err != nil {
		return fail(stderr, "edge pki issue", err)
	}
	printFiles(stdout, *dir, nodeFiles(nodes[0]))
	return printRecipients(stdout, stderr, "edge pki issue", *dir, nodes)
}

// runIssuer writes a new lease issuer pair and prints its public key in
// the form of a node config's credentials.issuer_public_keys entry.
func runIssuer(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("issuer", stderr)
	dir := fs.String("dir", "", "PKI directory")
	name := fs.String("name", "", "file name stem: writes NAME.key and NAME.pub")
	force := fs.Bool("force", false, "overwrite existing files")
	if code, done := parse(fs, args, stderr); done {
		return code
	}
	if *dir == "" || *name == "" {
		fmt.Fprint(stderr, "edge pki issuer: missing -dir or -name\n"+usage)
		return ExitUsage
	}
	if err := identity.NewIssuer(*dir, *name, *force); err != nil {
		return fail(stderr, "edge pki issuer", err)
	}
	printFiles(stdout, *dir, []string{*name + ".key", *name + ".pub"})
	pub, err := identity.LoadIssuerPublicKey(filepath.Join(*dir, *name+".pub"))
	if err != nil {
		return fail(stderr, "edge pki issuer", err)
	}
	fmt.Fprintf(stdout, "\nlease issuer public key (add to each node's credentials.issuer_public_keys before the edge switches):\n  %s\n",
		identity.IssuerPublicKeyBase64(pub))
	return ExitOK
}

func nodeFiles(n string) []string {
	return []string{identity.CertFileName(n), identity.KeyFileName(n),
		identity.RecipientKeyFileName(n), identity.RecipientPubFileName(n)}
}

func printFiles(w io.Writer, dir string, files []string) {
	for _, f := range files {
		fmt.Fprintf(w, "wrote %s\n", filepath.Join(dir, f))
	}
}

// printRecipients prints, per node, the edge config line to paste into
// nodes[] for that node.
func printRecipients(stdout, stderr io.Writer, cmd, dir string, nodes []string) int {
	if len(nodes) == 0 {
		return ExitOK // nodes that join with a token (SPEC J1) need no nodes[] entry
	}
	fmt.Fprintln(stdout, "\nedge config nodes[].lease_recipient_public_key:")
	for _, n := range nodes {
		pub, err := identity.LoadRecipientPublicKey(filepath.Join(dir, identity.RecipientPubFileName(n)))
		if err != nil {
			return fail(stderr, cmd, err)
		}
		fmt.Fprintf(stdout, "  %s: \"lease_recipient_public_key\": %q\n", n, identity.RecipientPublicKeyBase64(pub))
	}
	return ExitOK
}

// fail prints err and maps it to an exit code: invalid names or options are
// usage errors, everything else (I/O, existing files) is ExitError.
func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
	if errors.Is(err, identity.ErrInvalidOptions) {
		return ExitUsage
	}
	if errors.Is(err, identity.ErrFileExists) {
		fmt.Fprintln(stderr, "use -force to overwrite")
	}
	return ExitError
}
