package limiter

// Catalogued returns the enum and id format that Let's Encrypt's Boulder
// gives the limit called name. Their files name limits without either, and
// our bucket keys must agree with Boulder's numbering for a later import to
// keep its buckets, so these names get both from here rather than from the
// next free number. The names are case-sensitive, as limit names are.
func Catalogued(name string) (enum int, format IDFormat, ok bool) {
	switch name {
	case "NewRegistrationsPerIPAddress":
		return 1, IPAddress, true
	case "NewRegistrationsPerIPv6Range":
		return 2, IPv6Range, true
	case "NewOrdersPerAccount":
		return 3, RegID, true
	case "FailedAuthorizationsPerDomainPerAccount":
		return 4, RegIDDomain, true
	case "CertificatesPerDomain":
		return 5, DomainOrCIDR, true
	case "CertificatesPerDomainPerAccount":
		return 6, RegIDDomain, true
	case "CertificatesPerFQDNSet":
		return 7, FQDNSet, true
	case "FailedAuthorizationsForPausingPerDomainPerAccount":
		return 8, RegIDDomain, true
	case "LimitOverrideRequestsPerIPAddress":
		return 9, IPAddress, true
	}
	return 0, "", false
}

// CatalogueName is the inverse of Catalogued: the limit name that owns a
// catalogue enum, or "".
func CatalogueName(enum int) string {
	switch enum {
	case 1:
		return "NewRegistrationsPerIPAddress"
	case 2:
		return "NewRegistrationsPerIPv6Range"
	case 3:
		return "NewOrdersPerAccount"
	case 4:
		return "FailedAuthorizationsPerDomainPerAccount"
	case 5:
		return "CertificatesPerDomain"
	case 6:
		return "CertificatesPerDomainPerAccount"
	case 7:
		return "CertificatesPerFQDNSet"
	case 8:
		return "FailedAuthorizationsForPausingPerDomainPerAccount"
	case 9:
		return "LimitOverrideRequestsPerIPAddress"
	}
	return ""
}
