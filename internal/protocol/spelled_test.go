package protocol_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"iop/internal/protocol"
)

// H2, H5, H7: the node's code names the health, liveness and fence values
// it puts on the wire (ExecutionFailure.provider_health,
// liveness_classification and fence; the CAPABILITIES provider_status)
// through this package's constants, never as its own string literals: a
// value renamed here then changes every sender at once, where a literal
// left behind would be read by the edge as unknown (fail closed) and
// nothing would fail.
func TestH2NodeSpellsNoWireValue(t *testing.T) {
	values := map[string]bool{}
	for _, v := range []string{
		protocol.HealthAvailable, protocol.HealthUnavailable, protocol.HealthUnknown,
		protocol.LivenessRequestStalled, protocol.LivenessProviderUnhealthy, protocol.LivenessHealthUnknown,
		protocol.FenceConfirmed, protocol.FenceUnconfirmed,
		protocol.ResidencyUnloaded, protocol.ResidencyLoading, protocol.ResidencyLoaded, protocol.ResidencyStopping, protocol.ResidencyFailed,
	} {
		values[v] = true
	}
	root := filepath.Join("..", "node")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && values[s] {
				t.Errorf("%s: the wire value %q spelled as a literal; use its constant in internal/protocol (values.go)",
					fset.Position(lit.Pos()), s)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
