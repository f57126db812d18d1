package providers

// Exported for the external tests (package providers_test), which use the
// one provider fake, providers/providertest, and so cannot be in package
// providers: providertest imports it.
//
// DocsExample is docsExample, the providers config of docs/providers.md.
const DocsExample = docsExample

var (
	// TestTypes is testTypes: the stub block readers of the config tests.
	TestTypes = testTypes
	// DecodeStub is decodeStub, the stub block reader.
	DecodeStub = decodeStub
)
