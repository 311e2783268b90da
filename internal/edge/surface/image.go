package surface

import (
	"encoding/base64"
	"net/http"
	"slices"
	"strings"

	iop "iop/proto/gen/iop"
)

// DataURLImage decodes an image given as a data: URL
// ("data:image/png;base64,<data>", RFC 2397) into a ChatImage. Any other
// URL is refused: the run path never makes a node fetch a URL a client
// named (that would let clients reach whatever the node can reach). field
// names the URL's field in errors, which are 400s.
func DataURLImage(field, url string) (*iop.ChatImage, *Error) {
	rest, ok := strings.CutPrefix(url, "data:")
	if !ok {
		if strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://") {
			return nil, BadRequest(field, "%s: remote image URLs are not supported by this model's provider; send the image inline as a data: URL (data:image/png;base64,…)", field)
		}
		return nil, BadRequest(field, "%s: want a data: URL (data:image/png;base64,…)", field)
	}
	meta, data, ok := strings.Cut(rest, ",")
	mediaType, isB64 := strings.CutSuffix(meta, ";base64")
	if !ok || !isB64 {
		return nil, BadRequest(field, "%s: want a base64 data: URL (data:image/png;base64,…)", field)
	}
	return Base64Image(field, mediaType, data)
}

// ImageTypes are the image media types the run path takes: the ones
// OpenAI's and Anthropic's APIs take, and that Ollama decodes.
var ImageTypes = []string{"image/jpeg", "image/png", "image/gif", "image/webp"}

// Base64Image decodes base64 image data (standard alphabet, padding
// optional) of mediaType, one of ImageTypes, into a ChatImage. Errors are
// 400s naming field: another media type, data that is not base64, or
// bytes that are not an image of that type (as Anthropic answers; Ollama
// would drop an image it cannot decode and answer as if none was sent).
func Base64Image(field, mediaType, data string) (*iop.ChatImage, *Error) {
	if !slices.Contains(ImageTypes, mediaType) {
		return nil, BadRequest(field, "%s: media type %q is not one of %s", field, mediaType, strings.Join(ImageTypes, ", "))
	}
	enc := base64.StdEncoding
	if len(data)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	raw, err := enc.DecodeString(data)
	if err != nil || len(raw) == 0 {
		return nil, BadRequest(field, "%s: the image data is not valid base64", field)
	}
	if got := http.DetectContentType(raw); got != mediaType {
		return nil, BadRequest(field, "%s: the image data is not of type %s (its bytes look like %s)", field, mediaType, got)
	}
	return &iop.ChatImage{MediaType: mediaType, Data: raw}, nil
}
