package limiter

// Catalogued returns the enum and id format that Let's Encrypt's Boulder
// gives the limit called name. Their files name limits without either, and
// our bucket keys must agree with Boulder's numbering for a later import to
// keep its buckets, so these names get both from here rather than from the
// next free number. The names are case-sensitive, as limit names are.
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
