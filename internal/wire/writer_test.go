package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"

	iop "iop/proto/gen/iop"

	"google.golang.org/protobuf/proto"
)

// kindRows holds one realistic Envelope per payload kind of the Envelope
// oneof, keyed by the oneof field name. TestEveryKindHasARow fails when the
// schema gains a kind without a row here.
func kindRows() map[string]*iop.Envelope {
	lease := &iop.CredentialLease{
		LeaseId: "lease-1", IssuedAtUnixMs: 1_700_000_000_000, ExpiresAtUnixMs: 1_700_000_060_000,
		HpkeEnc: []byte{1, 2, 3}, Ciphertext: []byte("sealed"), Signature: bytes.Repeat([]byte{9}, 64),
		IssuerKeyId: "ab12", RecipientKeyId: "cd34",
	}
	binding := &iop.CredentialLeaseBinding{
		Principal: "team-a", Slot: "openai", Route: "gpt", Profile: "openai", UpstreamTarget: "gpt-4o",
		NodeId: "gpu-1", Recipient: "cd34", CredentialRevision: 3, RouteRevision: 4, ProjectionGeneration: 5,
		AuthHeader: "Authorization", AuthScheme: "Bearer",
	}
	stall := &iop.ExecutionFailure{
		Code: "response_stalled", ProviderHealth: "available", LivenessClassification: "request_stalled",
		IdleMs: 300000, NodeRunId: "nr-1", AttemptId: "a-1", Fence: "confirmed", Adapter: "ollama",
		Target: "llama3.1:8b", HealthObservationSeq: 12,
	}
	config := &iop.NodeConfigPayload{
		Adapters: []*iop.AdapterConfig{
			{Name: "ollama", Type: "ollama", Category: "local_inference", Capacity: 2, LongCapacity: 1, BaseUrl: "http://127.0.0.1:11434"},
			{Name: "vllm", Type: "openai_compat", Category: "local_inference", Capacity: 8, BaseUrl: "http://127.0.0.1:8000",
				UpstreamIdleTimeoutMs: 3000, ApiKeyEnv: "VLLM_KEY",
				OpenaiCompat: &iop.OpenAICompatAdapterConfig{ProtocolProfile: &iop.ConcreteProtocolProfile{
					Name: "vllm", BaseUrl: "http://127.0.0.1:8000", AuthHeader: "Authorization", AuthScheme: "Bearer",
					ModelsPath: "/v1/models", ChatCompletionsPath: "/v1/chat/completions", NativeTools: true, HealthPath: "/health",
				}}},
		},
		Runtime:  &iop.NodeRuntimeConfig{Concurrency: 4, HeartbeatIntervalMs: 5000, HeartbeatTimeoutMs: 15000, CredentialsEnabled: true},
		Revision: "9f86d081884c7d65",
	}
	temp, seed := 0.2, int64(42)
	return map[string]*iop.Envelope{
		"register_request": {Kind: &iop.Envelope_RegisterRequest{RegisterRequest: &iop.RegisterRequest{NodeId: "gpu-1", Version: "0.1.0"}}},
		"register_response": {Kind: &iop.Envelope_RegisterResponse{RegisterResponse: &iop.RegisterResponse{
			Accepted: true, Config: config}}},
		"ready_request":  {Kind: &iop.Envelope_ReadyRequest{ReadyRequest: &iop.NodeReadyRequest{NodeId: "gpu-1"}}},
		"ready_response": {Kind: &iop.Envelope_ReadyResponse{ReadyResponse: &iop.NodeReadyResponse{Ready: false, Reason: "superseded"}}},
		"ping":           {Kind: &iop.Envelope_Ping{Ping: &iop.HeartbeatPing{SentUnixMs: 1_700_000_000_000, Nonce: 77}}},
		"pong":           {Kind: &iop.Envelope_Pong{Pong: &iop.HeartbeatPong{SentUnixMs: 1_700_000_000_001, Nonce: 77}}},
		"run_request": {RunId: "run-1", Kind: &iop.Envelope_RunRequest{RunRequest: &iop.RunRequest{
			Adapter: "ollama", Target: "llama3.1:8b", TimeoutSec: 600, SessionId: "s-1", ResponseStallTimeoutMs: 300000,
			Metadata:        map[string]string{"trace": "t-1", "user": "u"},
			CredentialLease: lease, CredentialBinding: binding,
			Input: &iop.RunInput{
				Messages: []*iop.ChatMessage{
					{Role: "system", Content: "Be brief."},
					{Role: "user", Content: "héllo ✓"},
					{Role: "assistant", ToolCallsJson: []byte(`[{"id":"c1"}]`)},
					{Role: "tool", ToolCallId: "c1", Content: "42"},
				},
				ToolsJson: []byte(`[{"type":"function"}]`), ToolChoiceJson: []byte(`"auto"`),
				MaxTokens: 256, Temperature: &temp, Stop: []string{"\n\n"}, Seed: &seed,
			},
		}}},
		"run_event": {RunId: "run-1", Kind: &iop.Envelope_RunEvent{RunEvent: &iop.RunEvent{
			Seq: 9, Type: iop.RunEventType_RUN_EVENT_ERROR, Error: "stalled", FailureCode: "response_stalled",
			Metadata: map[string]string{"idle_ms": "300000"}, Adapter: "ollama", Target: "llama3.1:8b",
			UpstreamStatus: 0, Failure: stall, Usage: &iop.Usage{PromptTokens: 10, CompletionTokens: 2, TotalTokens: 12},
		}}},
		"tunnel_request": {RunId: "run-2", Kind: &iop.Envelope_TunnelRequest{TunnelRequest: &iop.ProviderTunnelRequest{
			Adapter: "vllm", Target: "qwen", Method: "POST", Path: "/v1/chat/completions", Operation: "chat_completions",
			Headers: []*iop.Header{{Name: "Content-Type", Value: "application/json"}},
			Body:    []byte(`{"model":"qwen","stream":true}`), Stream: true, TimeoutSec: 60,
			Metadata: map[string]string{"k": "v"}, SessionId: "s-2", CredentialLease: lease, CredentialBinding: binding,
			ResponseStallTimeoutMs: 120000,
		}}},
		"tunnel_frame": {RunId: "run-2", Kind: &iop.Envelope_TunnelFrame{TunnelFrame: &iop.ProviderTunnelFrame{
			Seq: 3, Kind: iop.TunnelFrameKind_TUNNEL_FRAME_ERROR, Status: 200,
			Headers: []*iop.Header{{Name: "Content-Type", Value: "text/event-stream"}},
			Body:    []byte("data: {}\n\n"), Usage: &iop.Usage{TotalTokens: 3}, Error: "stalled", FailureCode: "response_stalled",
			Metadata: map[string]string{"idle_ms": "1"}, Adapter: "vllm", Target: "qwen", Failure: stall,
		}}},
		"cancel_request": {RunId: "run-2", Kind: &iop.Envelope_CancelRequest{CancelRequest: &iop.CancelRequest{Reason: "client_disconnected"}}},
		"command_request": {RequestId: "req-1", Kind: &iop.Envelope_CommandRequest{CommandRequest: &iop.NodeCommandRequest{
			Type: iop.NodeCommandType_NODE_COMMAND_CAPABILITIES, Adapter: "ollama", Target: "llama3.1:8b", Args: map[string]string{"a": "b"},
		}}},
		"command_response": {RequestId: "req-1", Kind: &iop.Envelope_CommandResponse{CommandResponse: &iop.NodeCommandResponse{
			Ok: true, Result: map[string]string{"adapter_key": "ollama", "provider_status": "available"},
		}}},
		"refresh_request": {RequestId: "req-2", Kind: &iop.Envelope_RefreshRequest{RefreshRequest: &iop.NodeConfigRefreshRequest{Config: config}}},
		"refresh_response": {RequestId: "req-2", Kind: &iop.Envelope_RefreshResponse{RefreshResponse: &iop.NodeConfigRefreshResponse{
			Status: iop.RefreshStatus_REFRESH_RESTART_REQUIRED, Reason: "adapter type changed",
		}}},
		"draining_notice": {Kind: &iop.Envelope_DrainingNotice{DrainingNotice: &iop.NodeDrainingNotice{DrainTimeoutMs: 30000}}},
		"config_rejected": {Kind: &iop.Envelope_ConfigRejected{ConfigRejected: &iop.NodeConfigRejected{Revision: "r1",
			Reason: `adapter "ollama": another edge runs another backend under this adapter name`}}},
		"join_request": {Kind: &iop.Envelope_JoinRequest{JoinRequest: &iop.NodeJoinRequest{
			TokenId: "4abcc7fa34f62fd8", TokenSecret: "BrsPoMEw2j76hN_mBwRXgQ9myHjAAOxGItRmn80oqZQ", NodeName: "gpu-3",
			Csr: bytes.Repeat([]byte{0x30}, 400), LeaseRecipientPublicKey: bytes.Repeat([]byte{7}, 32), Version: "0.4.0",
		}}},
		"join_response": {Kind: &iop.Envelope_JoinResponse{JoinResponse: &iop.NodeJoinResponse{
			Ok: true, NodeName: "gpu-3", TrustDomain: "iop.local", EdgeName: "edge-1",
			CertificatePem: []byte("-----BEGIN CERTIFICATE-----\n…"), CaPem: []byte("-----BEGIN CERTIFICATE-----\n…"),
			IssuerPublicKey: bytes.Repeat([]byte{5}, 32), NotAfterUnixMs: 1_700_086_400_000,
		}}},
		"renew_request": {Kind: &iop.Envelope_RenewRequest{RenewRequest: &iop.CertificateRenewRequest{Csr: bytes.Repeat([]byte{0x30}, 400)}}},
		"renew_response": {Kind: &iop.Envelope_RenewResponse{RenewResponse: &iop.CertificateRenewResponse{
			Ok: true, CertificatePem: []byte("-----BEGIN CERTIFICATE-----\n…"), NotAfterUnixMs: 1_700_086_400_000,
		}}},
		"models_report": {Kind: &iop.Envelope_ModelsReport{ModelsReport: &iop.NodeModelsReport{Adapters: []*iop.AdapterModels{
			{Adapter: "ollama", Models: []string{"llama3.1:8b", "qwen2.5:7b"}}, {Adapter: "vllm", Error: "upstream status 503"},
		}}}},
		"residency_report": {Kind: &iop.Envelope_ResidencyReport{ResidencyReport: &iop.NodeResidencyReport{Adapters: []*iop.AdapterResidency{
			{Adapter: "llama", Models: []*iop.ModelResidency{{Model: "qwen2.5-7b", State: "loaded", LoadMs: 4200, MemoryMb: 5400, InFlight: 2},
				{Model: "tiny", State: "unloaded"}}},
		}}}},
	}
}

// TestEveryKindHasARow walks the Envelope oneof descriptor: every payload kind
// needs a row in kindRows, and every row must set the kind it is named after
// (SPEC W2, W6).
func TestEveryKindHasARow(t *testing.T) {
	rows := kindRows()
	oneof := (&iop.Envelope{}).ProtoReflect().Descriptor().Oneofs().ByName("kind")
	if oneof == nil {
		t.Fatal("W2 Envelope has no oneof named kind")
	}
	fields := oneof.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		env, ok := rows[string(fd.Name())]
		if !ok {
			t.Errorf("W2 Envelope kind %s (field %d) has no row in kindRows: add one", fd.Name(), fd.Number())
			continue
		}
		if got := env.ProtoReflect().WhichOneof(oneof); got == nil || got.Name() != fd.Name() {
			t.Errorf("W2 row %s sets kind %v", fd.Name(), got)
		}
	}
	if len(rows) != fields.Len() {
		t.Errorf("W2 kindRows has %d rows, the oneof %d kinds", len(rows), fields.Len())
	}
}

// TestRoundTripEveryKind writes each kind through a Writer and reads it back
// through a Reader, one frame per kind and all kinds in one stream (SPEC W1, W2).
func TestRoundTripEveryKind(t *testing.T) {
	rows := kindRows()
	var stream bytes.Buffer
	all := NewWriter(&stream, 0)
	var order []string
	for name, want := range rows {
		t.Run("W2 "+name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := NewWriter(&buf, 0).WriteEnvelope(want); err != nil {
				t.Fatalf("WriteEnvelope: %v", err)
			}
			r := NewReader(&buf, DefaultMaxFrame)
			var got iop.Envelope
			if err := r.ReadEnvelope(&got); err != nil {
				t.Fatalf("ReadEnvelope: %v", err)
			}
			if !proto.Equal(&got, want) {
				t.Errorf("round trip:\n got %v\nwant %v", &got, want)
			}
			if err := r.ReadEnvelope(&got); err != io.EOF {
				t.Errorf("after the only frame: got %v, want io.EOF", err)
			}
		})
		if err := all.WriteEnvelope(want); err != nil {
			t.Fatalf("WriteEnvelope %s: %v", name, err)
		}
		order = append(order, name)
	}
	r := NewReader(&stream, DefaultMaxFrame)
	for _, name := range order {
		var got iop.Envelope
		if err := r.ReadEnvelope(&got); err != nil || !proto.Equal(&got, rows[name]) {
			t.Errorf("W1 stream of all kinds, frame %s: got %v (%v)", name, &got, err)
		}
	}
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Errorf("W1 end of stream: got %v, want io.EOF", err)
	}
}

// recordingWriter records each Write call.
type recordingWriter struct {
	writes [][]byte
	err    error
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(p))
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// TestWriterRefuses: frames the peer must reject are refused with nothing
// written, and the Writer stays usable afterwards (SPEC W1, W2).
func TestWriterRefuses(t *testing.T) {
	const limit = 1000
	tests := []struct {
		name    string
		write   func(w *Writer) error
		wantErr error
		wantLen uint32
	}{
		{"W1 envelope over cap", func(w *Writer) error { return w.WriteEnvelope(envelopeOfSize(t, limit+1)) }, ErrFrameTooLarge, limit + 1},
		{"W1 envelope far over cap", func(w *Writer) error { return w.WriteEnvelope(tunnelBody("r", 1, 1<<20, 'x')) }, ErrFrameTooLarge, 0},
		{"W1 empty envelope", func(w *Writer) error { return w.WriteEnvelope(&iop.Envelope{}) }, ErrEmptyFrame, 0},
		{"W1 nil envelope", func(w *Writer) error { return w.WriteEnvelope(nil) }, ErrEmptyFrame, 0},
		{"W2 ids without payload", func(w *Writer) error { return w.WriteEnvelope(&iop.Envelope{RunId: "run-1"}) }, ErrNoPayload, 0},
		{"W1 raw body over cap", func(w *Writer) error { return w.WriteFrame(make([]byte, limit+1)) }, ErrFrameTooLarge, limit + 1},
		{"W1 raw body empty", func(w *Writer) error { return w.WriteFrame(nil) }, ErrEmptyFrame, 0},
	}
	next := &iop.Envelope{Kind: &iop.Envelope_Ping{Ping: &iop.HeartbeatPing{Nonce: 1}}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recordingWriter{}
			w := NewWriter(rec, limit)
			err := tc.write(w)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err: got %v, want %v", err, tc.wantErr)
			}
			var fe *FrameError
			if !errors.As(err, &fe) {
				t.Fatalf("err: got %T, want *FrameError", err)
			}
			if tc.wantLen != 0 && fe.Length != tc.wantLen {
				t.Errorf("FrameError.Length: got %d, want %d", fe.Length, tc.wantLen)
			}
			if len(rec.writes) != 0 {
				t.Fatalf("wrote %d times (%d bytes first), want nothing written", len(rec.writes), len(rec.writes[0]))
			}
			if err := w.WriteEnvelope(next); err != nil {
				t.Fatalf("next WriteEnvelope: %v", err)
			}
			var got iop.Envelope
			if len(rec.writes) != 1 {
				t.Fatalf("next frame took %d writes, want 1", len(rec.writes))
			}
			if err := NewReader(bytes.NewReader(rec.writes[0]), 0).ReadEnvelope(&got); err != nil || !proto.Equal(&got, next) {
				t.Errorf("next frame: got %v (%v), want %v", &got, err, next)
			}
		})
	}
}

// TestWriterCap: exactly the cap is written in one Write call; SetMaxFrame
// moves the cap (SPEC W1).
func TestWriterCap(t *testing.T) {
	rec := &recordingWriter{}
	w := NewWriter(rec, 0)
	if w.MaxFrame() != DefaultMaxFrame {
		t.Errorf("default cap: got %d, want %d", w.MaxFrame(), DefaultMaxFrame)
	}
	w.SetMaxFrame(DefaultPreReadyCap)
	if err := w.WriteEnvelope(envelopeOfSize(t, DefaultPreReadyCap)); err != nil {
		t.Fatalf("W1 envelope of exactly the cap: %v", err)
	}
	if err := w.WriteEnvelope(envelopeOfSize(t, DefaultPreReadyCap+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("W1 envelope of cap+1: got %v, want %v", err, ErrFrameTooLarge)
	}
	if len(rec.writes) != 1 || len(rec.writes[0]) != HeaderSize+DefaultPreReadyCap {
		t.Fatalf("writes: got %d, want one of %d bytes", len(rec.writes), HeaderSize+DefaultPreReadyCap)
	}
	if err := w.WriteFrame(rec.writes[0][HeaderSize:]); err != nil {
		t.Errorf("W1 raw body of exactly the cap: %v", err)
	}
	if !bytes.Equal(rec.writes[1], rec.writes[0]) {
		t.Errorf("WriteFrame of the same body wrote different bytes")
	}
}

// TestWriterPropagatesWriteError: the underlying write error is returned.
func TestWriterPropagatesWriteError(t *testing.T) {
	errBroken := errors.New("broken pipe")
	w := NewWriter(&recordingWriter{err: errBroken}, 0)
	if err := w.WriteEnvelope(kindRows()["ping"]); !errors.Is(err, errBroken) {
		t.Errorf("WriteEnvelope: got %v, want %v", err, errBroken)
	}
	if err := w.WriteFrame([]byte{0x72, 0x00}); !errors.Is(err, errBroken) {
		t.Errorf("WriteFrame: got %v, want %v", err, errBroken)
	}
}

// TestAppendFrame: frames are appended after existing bytes; on error dst is
// returned unextended.
func TestAppendFrame(t *testing.T) {
	prefix := []byte("prefix")
	env := kindRows()["pong"]
	out, err := AppendFrame(bytes.Clone(prefix), env, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out[:len(prefix)], prefix) || !bytes.Equal(out[len(prefix):], frameOf(mustMarshal(t, env))) {
		t.Errorf("W1 AppendFrame: got %x", out)
	}
	out, err = AppendFrame(bytes.Clone(prefix), tunnelBody("r", 1, 100, 'x'), 50)
	if !errors.Is(err, ErrFrameTooLarge) || !bytes.Equal(out, prefix) {
		t.Errorf("W1 AppendFrame over cap: got %q, %v; want the prefix and %v", out, err, ErrFrameTooLarge)
	}
}
