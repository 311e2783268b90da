package surface

import (
	"encoding/base64"
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
	if !strings.HasPrefix(mediaType, "image/") {
		return nil, BadRequest(field, "%s: media type %q is not an image type", field, mediaType)
	}
	return Base64Image(field, mediaType, data)
}

// Base64Image decodes base64 image data (standard alphabet, padding
// optional) of mediaType into a ChatImage; errors are 400s naming field.
func Base64Image(field, mediaType, data string) (*iop.ChatImage, *Error) {
	enc := base64.StdEncoding
	if len(data)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	raw, err := enc.DecodeString(data)
	if err != nil || len(raw) == 0 {
		return nil, BadRequest(field, "%s: the image data is not valid base64", field)
	}
	return &iop.ChatImage{MediaType: mediaType, Data: raw}, nil
}
