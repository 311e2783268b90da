package upstream

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// EncodingError: the provider's answer carries a Content-Encoding (RFC 9110
// §8.4) the node cannot decode, or a body that is not in the coding its
// header names (not gzip at all, corrupt, or cut before the coding's end).
// Encoding is the header's value, at most 32 bytes of it. It wraps
// ErrProtocol (→ "upstream_error"); its Error text names the coding and is
// the client's words for the failure (SPEC B3).
type EncodingError struct {
	Encoding string
	Err      error
}

func (e *EncodingError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("the provider answered Content-Encoding %.32q although the node asked for identity, and the node decodes only gzip and deflate", e.Encoding)
	}
	return fmt.Sprintf("the provider's body is not valid Content-Encoding %.32q: %v", e.Encoding, e.Err)
}

func (e *EncodingError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrProtocol}
	}
	return []error{ErrProtocol, e.Err}
}

// decodeBody makes resp.Body read the decoded bytes of a coded answer
// (SPEC B3). Every request says "Accept-Encoding: identity", yet some
// OpenAI-compatible servers and the proxies before them compress anyway;
// the node decodes gzip (and x-gzip) and deflate — zlib-wrapped as RFC
// 9110 §8.4.1.2 says, or raw RFC 1951 as some servers send — as the body is
// read, so every bound a reader puts on the body (the NDJSON and SSE line
// caps, upstream.MaxResultBytes, the models list's MaxModelsBody, 32 KiB
// tunnel BODY frames) bounds the decoded bytes: a decompression bomb costs
// what the same body sent uncompressed would. The header then goes, as
// does Content-Length (it counted the coded bytes), and resp.Uncompressed
// is set, as net/http does when it decodes. Any other coding, or more than
// one, leaves the header and makes the first read fail with an
// *EncodingError naming it; the status line and headers stay readable.
func decodeBody(resp *http.Response) {
	if resp.Body == nil || resp.Body == http.NoBody {
		return
	}
	values := resp.Header.Values("Content-Encoding")
	var codings []string
	for _, v := range values {
		for _, c := range strings.Split(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	if len(codings) == 0 {
		return
	}
	named := strings.Join(values, ", ")
	if len(codings) > 1 || (codings[0] != "gzip" && codings[0] != "x-gzip" && codings[0] != "deflate") {
		resp.Body = &refusedBody{raw: resp.Body, err: &EncodingError{Encoding: named}}
		return
	}
	resp.Body = &decodedBody{raw: &rawBody{r: resp.Body}, coding: codings[0], named: named}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
}

// refusedBody fails every read with err; Close closes the raw body.
type refusedBody struct {
	raw io.ReadCloser
	err error
}

func (b *refusedBody) Read([]byte) (int, error) { return 0, b.err }
func (b *refusedBody) Close() error             { return b.raw.Close() }

// rawBody remembers the coded body's own read error, so that a reset or a
// cancel under the decoder stays what it was instead of an EncodingError.
type rawBody struct {
	r    io.ReadCloser
	err  error
	read bool // a byte arrived
}

func (b *rawBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if n > 0 {
		b.read = true
	}
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// decodedBody decodes the coded body lazily: the decoder is made at the
// first Read (gzip reads its header then), so building the response never
// blocks on body bytes.
type decodedBody struct {
	raw    *rawBody
	coding string
	named  string
	dec    io.Reader
	err    error // sticky
}

func (b *decodedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.dec == nil {
		dec, err := b.open()
		if err != nil {
			b.err = b.classify(err)
			return 0, b.err
		}
		b.dec = dec
	}
	n, err := b.dec.Read(p)
	if err != nil && err != io.EOF {
		err = b.classify(err)
		b.err = err
	}
	return n, err
}

func (b *decodedBody) open() (io.Reader, error) {
	br := bufio.NewReader(b.raw)
	if _, err := br.Peek(1); err == io.EOF {
		return eofReader{}, nil // an empty body is empty in every coding
	}
	if b.coding != "deflate" {
		return gzip.NewReader(br)
	}
	// RFC 9110's "deflate" is the zlib format (RFC 1950); some servers send
	// raw deflate (RFC 1951). A zlib header is CM=8 with a check that makes
	// the first two bytes a multiple of 31; raw deflate rarely passes both.
	if h, err := br.Peek(2); err == nil && h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
		return zlib.NewReader(br)
	}
	return flate.NewReader(br), nil
}

// classify keeps the raw body's own failure as it was and names the coding
// in every other one.
func (b *decodedBody) classify(err error) error {
	if b.raw.err != nil {
		return b.raw.err
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
		err = errors.New("the body ended before the coding's end")
	}
	return &EncodingError{Encoding: b.named, Err: err}
}

func (b *decodedBody) Close() error { return b.raw.r.Close() }

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
