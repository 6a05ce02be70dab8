package limiter_test

import (
	"archive/zip"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratelimitd/ratelimitd/limiter"
)

// TestMain gives time.LoadLocation a host zone database of its own
// (ZONEINFO, which it reads before /usr/share/zoneinfo and before the
// database built in), holding names that the IANA database lacks, as a
// host's /usr/share/zoneinfo does: localtime, posixrules, right/UTC. The
// limiter's code must never find them.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "zoneinfo")
	if err != nil {
		panic(err)
	}
	paris := embeddedZone("Europe/Paris")
	for _, name := range hostOnlyZones {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			panic(err)
		}
		if err := os.WriteFile(path, paris, 0o644); err != nil {
			panic(err)
		}
	}
	os.Setenv("ZONEINFO", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// hostOnlyZones are names that hosts' zone directories hold and the IANA
// database does not.
var hostOnlyZones = []string{"localtime", "posixrules", "right/UTC", "right/Europe/Paris", "Host/Only"}

// embeddedZone reads a zone's file from the archive the limiter embeds.
func embeddedZone(name string) []byte {
	zr, err := zip.OpenReader("zoneinfo.zip")
	if err != nil {
		panic(err)
	}
	defer zr.Close()
	f, err := zr.Open(name)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		panic(err)
	}
	return b
}

// TestZonesFromTheBinaryOnly: a zone name is read from the database built
// into the binary and from nothing else. Names that the host offers
// time.LoadLocation, and Local, "", paths and garbage, are refused with
// the field's message; every name of the database loads.
func TestZonesFromTheBinaryOnly(t *testing.T) {
	for _, name := range hostOnlyZones {
		if _, err := time.LoadLocation(name); err != nil {
			t.Fatalf("the host's database of this test lacks %s: %v", name, err)
		}
	}
	refused := append([]string{"Local", "", "Europe/Pariss", "../../etc/passwd", "/etc/localtime", "Europe/Paris\x00",
		"Europe/\xffParis", "europe/paris", "Europe/Paris/", strings.Repeat("A", 65)}, hostOnlyZones...)
	for _, name := range refused {
		if loc, msg := limiter.LoadZone(name); loc != nil || msg == "" {
			t.Errorf("LoadZone(%q) = %v, %q; want a refusal", name, loc, msg)
		}
	}
	zr, err := zip.OpenReader("zoneinfo.zip")
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	for _, f := range zr.File {
		loc, msg := limiter.LoadZone(f.Name)
		if msg != "" || loc.String() != f.Name {
			t.Errorf("LoadZone(%q) = %v, %q", f.Name, loc, msg)
		}
	}
	if len(zr.File) < 500 {
		t.Errorf("the database holds %d zones", len(zr.File))
	}
	paris := zone(t, "Europe/Paris")
	if _, off := time.Date(2026, 7, 1, 12, 0, 0, 0, paris).Zone(); off != 2*3600 {
		t.Errorf("Paris in summer is %d s from UTC", off)
	}
}

// TestZoneDatabaseIsGos: the database built in is the one of the Go
// toolchain that builds the binary, the file time/tzdata is made of; a
// toolchain with newer zones needs `go generate ./limiter`.
func TestZoneDatabaseIsGos(t *testing.T) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Skipf("no go command: %v", err)
	}
	want, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "lib", "time", "zoneinfo.zip"))
	if err != nil {
		t.Skipf("the toolchain has no zoneinfo.zip: %v", err)
	}
	got, err := os.ReadFile("zoneinfo.zip")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("limiter/zoneinfo.zip differs from the toolchain's $GOROOT/lib/time/zoneinfo.zip: run go generate ./limiter")
	}
}
