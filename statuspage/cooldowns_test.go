package statuspage

import (
	"fmt"
	"testing"
	"time"
)

func TestCooldownsBySiteAreGroupedWorstFirstAndBounded(t *testing.T) {
	until := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rows := []Cooldown{
		{Site: "shop.com", Member: "a", Reason: "banned", Until: until, SecondsLeft: 60},
		{Site: "shop.com", Member: "b", Reason: "rate_limited", Until: until.Add(time.Minute), SecondsLeft: 120},
		{Site: "shop.com", Member: "c", Reason: "banned", Until: until, SecondsLeft: 60},
		{Site: SiteAll, Member: "d", Reason: "upstream_failed", Until: until, SecondsLeft: 30},
		{Site: "dead.example", Member: "a", Reason: "target_unreachable", Until: until, SecondsLeft: 10},
	}
	got := GroupCooldowns(rows)
	want := []string{"* 1 30", "shop.com 3 120", "dead.example 1 10"}
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(got), len(want), got)
	}
	for i, s := range got {
		if line := fmt.Sprintf("%s %d %d", s.Site, s.Members, s.SecondsLeft); line != want[i] {
			t.Errorf("row %d: %q, want %q (every site first, then most members resting)", i, line, want[i])
		}
	}
	if r := got[1].Reasons; r["banned"] != 2 || r["rate_limited"] != 1 {
		t.Errorf("shop.com reasons %v, want banned 2, rate_limited 1", r)
	}

	// A crawl through dead links: thousands of sites, one member each.
	var many []Cooldown
	for i := range 3000 {
		many = append(many, Cooldown{Site: fmt.Sprintf("dead-%04d.example", i), Member: "a", Reason: "target_unreachable", Until: until, SecondsLeft: 10})
	}
	many = append(many, rows...)
	got = GroupCooldowns(many)
	if len(got) != MaxCooldownSites || got[0].Site != SiteAll || got[1].Site != "shop.com" {
		t.Fatalf("%d rows starting %s, %s; want %d, every site then shop.com", len(got), got[0].Site, got[1].Site, MaxCooldownSites)
	}
	last := got[len(got)-1]
	total := 0
	for _, s := range got {
		total += s.Members
	}
	if last.Site != OtherSites || total != len(many) {
		t.Fatalf("last row %s; %d members in all rows, want the rest summed as %s and all %d counted", last.Site, total, OtherSites, len(many))
	}
	if b := boundCooldowns(many, got); len(b) != maxCooldownRows || b[0].Site != SiteAll || b[1].Site != "shop.com" {
		t.Fatalf("bounded rows: %d starting %s; want %d, the worst sites' first", len(b), b[0].Site, maxCooldownRows)
	}
}
