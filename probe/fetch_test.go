package probe

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestScrubPassword(t *testing.T) {
	const secret = "pr0be-s3cret"
	u, _ := url.Parse("http://user:" + secret + "@127.0.0.1:3128")
	err := ScrubPassword(fmt.Errorf("dial %s failed", u.String()), u)
	if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "xxxxx") {
		t.Errorf("scrubbed error = %v", err)
	}
	plain := errors.New("connection refused")
	if got := ScrubPassword(plain, u); got != plain {
		t.Errorf("an error without the password was rewritten: %v", got)
	}
}
