package providers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
)

func TestClass(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"nil is no class", nil, nil},
		{"bare transient", ErrTransient, ErrTransient},
		{"bare permanent", ErrPermanent, ErrPermanent},
		{"bare quota", ErrQuotaExceeded, ErrQuotaExceeded},
		{"bare not found", ErrNotFound, ErrNotFound},
		{"wrapped permanent keeps its class", fmt.Errorf("%w: bad image", ErrPermanent), ErrPermanent},
		{"doubly wrapped quota keeps its class", fmt.Errorf("create: %w", fmt.Errorf("%w: pods=1", ErrQuotaExceeded)), ErrQuotaExceeded},
		{"sentinel beside the cause is found", fmt.Errorf("%w: get pod: %w", ErrNotFound, io.EOF), ErrNotFound},
		{"outermost sentinel wins over a deeper one", fmt.Errorf("%w: reading address: %w", ErrTransient, fmt.Errorf("%w: access denied", ErrPermanent)), ErrTransient},
		{"shallower sentinel in a join wins", errors.Join(fmt.Errorf("host a: %w", fmt.Errorf("x: %w", ErrPermanent)), fmt.Errorf("host b: %w", ErrQuotaExceeded)), ErrQuotaExceeded},
		{"same depth prefers permanent over transient", errors.Join(ErrTransient, ErrPermanent), ErrPermanent},
		{"unclassified error is transient", errors.New("connection reset"), ErrTransient},
		{"deadline exceeded is transient", fmt.Errorf("create: %w", context.DeadlineExceeded), ErrTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Class(tt.err); got != tt.want {
				t.Fatalf("Class(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestResultLabel(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{fmt.Errorf("%w: x", ErrTransient), "transient"},
		{fmt.Errorf("%w: x", ErrPermanent), "permanent"},
		{fmt.Errorf("%w: x", ErrQuotaExceeded), "quota_exceeded"},
		{fmt.Errorf("%w: x", ErrNotFound), "not_found"},
		{errors.New("unclassified"), "transient"},
	}
	for _, tt := range tests {
		t.Run(tt.want+" from "+fmt.Sprint(tt.err), func(t *testing.T) {
			if got := ResultLabel(tt.err); got != tt.want {
				t.Fatalf("ResultLabel(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}
