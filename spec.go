// Package ratelimitd holds what belongs to the repository as a whole: the
// OpenAPI contract that the service implements and clients are generated
// from.
package ratelimitd

import (
	"bytes"
	_ "embed" // for openapi.yaml
)

//go:embed openapi.yaml
var openAPI []byte

// OpenAPI returns openapi.yaml.
func OpenAPI() []byte { return bytes.Clone(openAPI) }
