package limiter

// Parsers are what a snapshot needs of the packages that read bucket ids
// and descriptors. Those packages (limiter/bucketid, limiter/rules) import
// limiter; the engine is handed their functions by whoever builds a
// snapshot (the loader, and tests), so that it imports only the standard
// library and a decision never pulls in IDNA or the public suffix list.
type Parsers struct {
	// Canonical validates id under format f and returns its canonical
	// form (bucketid.Canonical). Its error's message is shown next to the
	// bucket id field.
	Canonical func(f IDFormat, id string) (string, error)
	// ValidateRule returns the field errors of a rule (rules.Validate);
	// Builder.PutRule refuses a rule that has any.
	ValidateRule func(Rule) []FieldError
	// IndexRules builds the matcher of a snapshot's rules (rules.Index),
	// once per snapshot whose rules changed.
	IndexRules func([]Rule) RuleMatcher
}
