package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fleetHelperEnv, when set, turns the test binary into a node fleet for
// BenchmarkThousandNodesReady/nodes=child-process, so that the benchmark's
// process holds the Edge alone and its heap growth is the Edge's. The value
// is "<pki dir>|<edge node address>|<node count>".
const fleetHelperEnv = "IOP_E2E_FLEET_HELPER"

func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(fleetHelperEnv); ok {
		if err := runFleet(spec, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "fleet helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runFleet is the helper's protocol: it writes "waiting", starts the nodes
// when a line "go" arrives on in, and stops them when in ends.
func runFleet(spec string, in io.Reader, out io.Writer) error {
	parts := strings.Split(spec, "|")
	if len(parts) != 3 {
		return fmt.Errorf("bad %s %q", fleetHelperEnv, spec)
	}
	n, err := strconv.Atoi(parts[2])
	if err != nil {
		return fmt.Errorf("bad node count: %w", err)
	}
	p, addr := pkiDir(parts[0]), parts[1]
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	fmt.Fprintln(out, "waiting")
	br := bufio.NewReader(in)
	if line, err := br.ReadString('\n'); err != nil || line != "go\n" {
		return fmt.Errorf("want go, got %q: %v", line, err)
	}
	nodes := make([]*nodeProc, 0, n)
	for _, id := range nodeIDs(n) {
		cfg, err := nodeConfigFor(p, id, addr, 1, 0)
		if err != nil {
			return err
		}
		nodes = append(nodes, launchNode(cfg, hc, nil))
	}
	io.Copy(io.Discard, br)
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes))
	for _, nd := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- nd.stop()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
