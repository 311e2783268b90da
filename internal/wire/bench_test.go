package wire

import (
	"bytes"
	"testing"

	iop "iop/proto/gen/iop"
)

// benchSizes are the upstream body sizes carried by a ProviderTunnelFrame
// BODY envelope: a small SSE chunk and the 32 KiB maximum of one upstream
// read (docs/wire.md, "Timeouts and bounds"). The frame is about 30 bytes longer.
var benchSizes = []struct {
	name string
	body int
}{
	{"256B", 256},
	{"32KiB", 32 << 10},
}

// BenchmarkFrameRoundTrip writes a tunnel BODY envelope with a Writer into an
// in-memory buffer and reads it back with a Reader: "envelope" decodes it
// into a reused iop.Envelope, "frame" stops at the raw body. b.SetBytes is
// the whole frame, header included.
func BenchmarkFrameRoundTrip(b *testing.B) {
	for _, sz := range benchSizes {
		env := tunnelBody("run-0123456789abcdef", 42, sz.body, 'x')
		for _, mode := range []string{"envelope", "frame"} {
			b.Run(sz.name+"/"+mode, func(b *testing.B) {
				var pipe bytes.Buffer
				w := NewWriter(&pipe, 0)
				r := NewReader(&pipe, DefaultMaxFrame)
				var got iop.Envelope
				roundTrip := func() {
					if err := w.WriteEnvelope(env); err != nil {
						b.Fatal(err)
					}
					if mode == "frame" {
						if _, err := r.ReadFrame(); err != nil {
							b.Fatal(err)
						}
						return
					}
					if err := r.ReadEnvelope(&got); err != nil {
						b.Fatal(err)
					}
				}
				roundTrip() // warm the buffers
				b.SetBytes(int64(frameLen(b, env)))
				b.ReportAllocs()
				for b.Loop() {
					roundTrip()
				}
			})
		}
	}
}

// BenchmarkReadFrame reads a raw frame from a source that repeats it forever:
// the Reader's own cost with its buffer reused (target ≤ 1 alloc/op).
func BenchmarkReadFrame(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			frame := frameOf(mustMarshal(b, tunnelBody("run-0123456789abcdef", 42, sz.body, 'x')))
			r := NewReader(&repeatReader{data: frame}, DefaultMaxFrame)
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.ReadFrame(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeEnvelope decodes a frame body into a reused iop.Envelope.
func BenchmarkDecodeEnvelope(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			body := mustMarshal(b, tunnelBody("run-0123456789abcdef", 42, sz.body, 'x'))
			var env iop.Envelope
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := Decode(body, &env); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWriteEnvelope marshals and writes a frame into a reused buffer.
func BenchmarkWriteEnvelope(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			env := tunnelBody("run-0123456789abcdef", 42, sz.body, 'x')
			var sink bytes.Buffer
			w := NewWriter(&sink, 0)
			b.SetBytes(int64(frameLen(b, env)))
			b.ReportAllocs()
			for b.Loop() {
				sink.Reset()
				if err := w.WriteEnvelope(env); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func frameLen(b testing.TB, env *iop.Envelope) int {
	return HeaderSize + len(mustMarshal(b, env))
}
