package testenv

import (
	"fmt"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
)

// ScaleClient returns the client-go Scale client over e, built the way
// kubectl scale and the HPA controller build theirs (discovery REST mapper,
// discovery scale-kind resolver), so a test of /scale exercises the path
// they take rather than a hand-written PUT.
func (e *Env) ScaleClient() (scale.ScalesGetter, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		return nil, fmt.Errorf("testenv: discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	sc, err := scale.NewForConfig(e.Config, mapper, dynamic.LegacyAPIPathResolverFunc, scale.NewDiscoveryScaleKindResolver(dc))
	if err != nil {
		return nil, fmt.Errorf("testenv: scale client: %w", err)
	}
	return sc, nil
}
