// Package charts holds no code: it is the home of the Helm chart's tests
// (package charts_test), which render charts/proxyfleet with the Helm SDK,
// install it into a real API server and check the dashboard's and alerts'
// queries against the metrics the binaries export. Nothing imports it, and
// the tests import the project's packages only as a user's cluster would
// meet them (the CRDs, the metric registries, the test kit).
package charts
