package limiter

import "fmt"

// Catalogued returns the enum and id format that Let's Encrypt's Boulder
// gives the limit called name. Their files name limits without either, and
// our bucket keys must agree with Boulder's numbering for a later import to
// keep its buckets, so these names get both from here rather than from the
// lowest number never given. The names are case-sensitive, as limit names are.
func Catalogued(name string) (enum int, format IDFormat, ok bool) {
	for enum, c := range catalogue {
		if c.name != "" && c.name == name {
			return enum, c.format, true
		}
	}
	return 0, "", false
}

// CatalogueName is the inverse of Catalogued: the limit name that owns a
// catalogue enum, or "".
func CatalogueName(enum int) string {
	if enum < 0 || enum >= len(catalogue) {
		return ""
	}
	return catalogue[enum].name
}

// catalogue is Let's Encrypt's list, by enum.
var catalogue = [...]struct {
	name   string
	format IDFormat
}{
	1: {"NewRegistrationsPerIPAddress", IPAddress},
	2: {"NewRegistrationsPerIPv6Range", IPv6Range},
	3: {"NewOrdersPerAccount", RegID},
	4: {"FailedAuthorizationsPerDomainPerAccount", RegIDDomain},
	5: {"CertificatesPerDomain", DomainOrCIDR},
	6: {"CertificatesPerDomainPerAccount", RegIDDomain},
	7: {"CertificatesPerFQDNSet", FQDNSet},
	8: {"FailedAuthorizationsForPausingPerDomainPerAccount", RegIDDomain},
	9: {"LimitOverrideRequestsPerIPAddress", IPAddress},
}

// CatalogueProblem says what is wrong with giving enum to the limit called
// name under the catalogue's rule, "" when nothing is: catalogue numbers go
// only to their names, and a catalogue name takes only its number, so that
// a later import of Boulder's files finds its limits where it expects them.
// An enum of 0 ("not chosen") is always accepted.
func CatalogueProblem(name string, enum int) string {
	if enum == 0 {
		return ""
	}
	if want, _, ok := Catalogued(name); ok && enum != want {
		return fmt.Sprintf("%s has enum %d in Let's Encrypt's catalogue", name, want)
	}
	if owner := CatalogueName(enum); owner != "" && owner != name {
		return fmt.Sprintf("%d is reserved for %s of Let's Encrypt's catalogue", enum, owner)
	}
	return ""
}
