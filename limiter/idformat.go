package limiter

// IDFormat names how the bucket ids of a limit are written and canonicalised.
// Decisions and overrides both pass their bucket ids through the limit's
// format, so that an override written in one notation matches decisions sent
// in another: every notation of one bucket maps to one string, and that string
// maps to itself. Package limiter/bucketid holds the canonical forms; the
// engine knows the names only.
type IDFormat string

// The id formats. Their values are stored with each limit and appear in the
// REST API, so they never change.
const (
	// IPAddress identifies a bucket per client address.
	IPAddress IDFormat = "ip_address"
	// IPv6Range groups IPv6 clients by /48, the smallest block a site is
	// usually assigned, so that one site cannot escape a limit by rotating
	// through its own addresses.
	IPv6Range IDFormat = "ipv6_range"
	// RegID identifies a bucket per account (registration) number.
	RegID IDFormat = "reg_id"
	// Domain identifies a bucket per fully qualified DNS name.
	Domain IDFormat = "domain"
	// DomainOrCIDR groups names by registered domain (eTLD+1) and addresses by
	// the block one party usually controls (IPv4 /32, IPv6 /64).
	DomainOrCIDR IDFormat = "domain_or_cidr"
	// IdentValue identifies a bucket per DNS name or IP address, as they
	// appear in an order's identifiers.
	IdentValue IDFormat = "ident_value"
	// FQDNSet identifies a bucket per set of names and addresses, whatever
	// their order or repetition in the request.
	FQDNSet IDFormat = "fqdn_set"
	// RegIDDomain identifies a bucket per account and DNS name.
	RegIDDomain IDFormat = "reg_id_domain"
	// RegIDFQDNSet identifies a bucket per account and set of names.
	RegIDFQDNSet IDFormat = "reg_id_fqdn_set"
	// String accepts any short printable text, for limits whose ids have no
	// structure worth checking; it is never rewritten.
	String IDFormat = "string"
)

// IDFormats lists every format in a stable order, so that documentation,
// validation messages and the OpenAPI enum agree. The caller owns the slice.
func IDFormats() []IDFormat {
	return []IDFormat{
		IPAddress, IPv6Range, RegID, Domain, DomainOrCIDR,
		IdentValue, FQDNSet, RegIDDomain, RegIDFQDNSet, String,
	}
}

// Valid reports whether f is one of IDFormats, so that a limit naming an
// unknown format is refused when it is written rather than on every decision.
func (f IDFormat) Valid() bool {
	switch f {
	case IPAddress, IPv6Range, RegID, Domain, DomainOrCIDR,
		IdentValue, FQDNSet, RegIDDomain, RegIDFQDNSet, String:
		return true
	}
	return false
}

// Hashed reports whether store keys of this format carry a hash of the id
// rather than the id itself. Free text and name sets can hold personal data
// (e-mail addresses, customer names) and can be long, so they never reach
// the store or its logs in clear.
func (f IDFormat) Hashed() bool {
	switch f {
	case String, FQDNSet, RegIDFQDNSet:
		return true
	}
	return false
}

// AccountWide reports whether overrides of f may name a bare registration
// id, covering every bucket of that account that has no override of its
// own: the snapshot looks such an override up when a bucket has none.
func (f IDFormat) AccountWide() bool { return f == RegIDDomain || f == RegIDFQDNSet }
