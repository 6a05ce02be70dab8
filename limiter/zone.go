package limiter

import (
	"archive/zip"
	"bytes"
	_ "embed"
	"time"
)

// zoneinfo is Go's copy of the IANA time zone database, the file that
// time/tzdata builds into a binary ($GOROOT/lib/time/zoneinfo.zip):
// LoadZone reads zones from it and from nothing else. time.LoadLocation
// reads the host's /usr/share/zoneinfo first, so that a name only some
// hosts have (localtime, posixrules, right/UTC) would be accepted on one
// replica and stop another from loading; this copy is the same on every
// replica of a build. A test keeps it equal to the toolchain's.
//
//go:generate sh -c "cp \"$(go env GOROOT)/lib/time/zoneinfo.zip\" zoneinfo.zip && chmod 644 zoneinfo.zip"
//go:embed zoneinfo.zip
var zoneinfo []byte

// zones are the files of zoneinfo by zone name, slices of it: the archive
// stores them uncompressed.
var zones = readZones(zoneinfo)

func readZones(archive []byte) map[string][]byte {
	zr, err := zip.NewReader(bytes.NewReader(archive), int64(len(archive)))
	if err != nil {
		panic("limiter: the embedded zone database: " + err.Error())
	}
	out := make(map[string][]byte, len(zr.File))
	for _, f := range zr.File {
		off, err := f.DataOffset()
		if err != nil || f.Method != zip.Store || off+int64(f.UncompressedSize64) > int64(len(archive)) {
			panic("limiter: the embedded zone database holds " + f.Name + " in a form it cannot read")
		}
		out[f.Name] = archive[off : off+int64(f.UncompressedSize64)]
	}
	return out
}

// LoadZone returns the IANA time zone called name, from the database built
// into the binary, or the problem of the name as a field's message. It is
// how every calendar quota's zone is read, whatever brings it: a limit's
// PUT, an import, a row the loader reads. Names the database lacks are
// refused: "Local" (the host's zone, which differs between replicas) and
// the host's own files alike.
func LoadZone(name string) (*time.Location, string) {
	switch {
	case name == "":
		return nil, "must not be empty; omit it for UTC"
	case len(name) > 64:
		return nil, "must be at most 64 characters"
	case name == "Local":
		return nil, "must be an IANA zone name such as Europe/Paris, not Local"
	}
	const unknown = "must be an IANA zone name such as Europe/Paris: unknown time zone in the database built into ratelimitd"
	data, ok := zones[name]
	if !ok {
		return nil, unknown
	}
	loc, err := time.LoadLocationFromTZData(name, data)
	if err != nil {
		return nil, unknown
	}
	return loc, ""
}
