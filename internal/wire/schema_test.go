package wire

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// W4: the field numbers and types the contract fixes.
func TestContractFieldNumbers(t *testing.T) {
	rows := []struct {
		name   string
		msg    protoreflect.MessageDescriptor
		field  protoreflect.Name
		number protoreflect.FieldNumber
		kind   protoreflect.Kind
	}{
		{"W4 RunEvent.failure", (&iop.RunEvent{}).ProtoReflect().Descriptor(), "failure", 13, protoreflect.MessageKind},
		{"W4 ProviderTunnelFrame.failure", (&iop.ProviderTunnelFrame{}).ProtoReflect().Descriptor(), "failure", 15, protoreflect.MessageKind},
		{"W4 ProviderTunnelRequest.operation", (&iop.ProviderTunnelRequest{}).ProtoReflect().Descriptor(), "operation", 13, protoreflect.StringKind},
		{"W4 RunRequest.response_stall_timeout_ms", (&iop.RunRequest{}).ProtoReflect().Descriptor(), "response_stall_timeout_ms", 10, protoreflect.Int64Kind},
		{"W4 ProviderTunnelRequest.response_stall_timeout_ms", (&iop.ProviderTunnelRequest{}).ProtoReflect().Descriptor(), "response_stall_timeout_ms", 14, protoreflect.Int64Kind},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			f := r.msg.Fields().ByName(r.field)
			if f == nil {
				t.Fatalf("%s has no field %s", r.msg.FullName(), r.field)
			}
			if f.Number() != r.number || f.Kind() != r.kind {
				t.Errorf("got number %d kind %v, want %d %v", f.Number(), f.Kind(), r.number, r.kind)
			}
		})
	}
	if f := (&iop.ExecutionFailure{}).ProtoReflect().Descriptor(); f.FullName() != "iop.runtime.v1.ExecutionFailure" {
		t.Errorf("ExecutionFailure full name %s", f.FullName())
	}
}

// W3: proto/gen/iop is exactly what protoc makes from proto/iop/runtime.proto
// (never hand-edited). `./run.sh test` installs protoc and the pinned
// protoc-gen-go and checks this first; here the same comparison runs when
// both are on PATH.
func TestGeneratedCodeMatchesSchema(t *testing.T) {
	if _, err := exec.LookPath("protoc"); err != nil {
		t.Skip("protoc not on PATH; ./run.sh test checks the generated code itself")
	}
	if _, err := exec.LookPath("protoc-gen-go"); err != nil {
		t.Skip("protoc-gen-go not on PATH; ./run.sh test checks the generated code itself")
	}
	root := filepath.Join("..", "..")
	committed, err := os.ReadFile(filepath.Join(root, "proto", "gen", "iop", "runtime.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	// Only the pinned generator versions reproduce the committed bytes.
	for _, tool := range []string{"protoc", "protoc-gen-go"} {
		out, err := exec.Command(tool, "--version").Output()
		if err != nil {
			t.Skipf("%s --version: %v", tool, err)
		}
		fields := strings.Fields(string(out))
		v := fields[len(fields)-1]
		if !strings.HasPrefix(v, "v") {
			v = "v" + v
		}
		if !bytes.Contains(committed, []byte(" "+v+"\n")) {
			t.Skipf("%s %s is not the version that generated proto/gen (./run.sh test installs the pinned one)", tool, v)
		}
	}
	out := t.TempDir()
	cmd := exec.Command("protoc", "-I", filepath.Join(root, "proto"), "--go_out="+out, "--go_opt=paths=source_relative", "iop/runtime.proto")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	got := committed
	want, err := os.ReadFile(filepath.Join(out, "iop", "runtime.pb.go"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("W3: proto/gen/iop/runtime.pb.go differs from protoc's output for proto/iop/runtime.proto; run ./run.sh proto")
	}
}
