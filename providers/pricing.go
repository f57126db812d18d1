package providers

// Pricer is implemented by providers whose config may give the hourly price
// of their instances (the aws, digitalocean and hetzner providers'
// hourlyPrice), so the controller can report what each Managed Proxy costs
// (proxyfleet_proxy_hourly_price). The price is the operator's figure in the
// operator's currency: providers do not ask a price API, whose answers
// depend on the account's discounts.
type Pricer interface {
	// HourlyPrice is what one instance costs an hour; 0 means not known.
	HourlyPrice() float64
}

// HourlyPriceOf returns p's configured hourly price, looking through
// decorators; 0 when p, or every layer, is no Pricer.
func HourlyPriceOf(p Provider) float64 {
	for p != nil {
		if pr, ok := p.(Pricer); ok {
			return pr.HourlyPrice()
		}
		u, ok := p.(Unwrapper)
		if !ok {
			return 0
		}
		p = u.Unwrap()
	}
	return 0
}
