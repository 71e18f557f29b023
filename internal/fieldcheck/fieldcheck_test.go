package fieldcheck

import "testing"

func TestCheck(t *testing.T) {
	if err := Check("p", "positive", map[string]bool{"A": true, "B": true}); err != nil {
		t.Errorf("all checks hold: %v, want nil", err)
	}
	err := Check("p", "positive", map[string]bool{"Zeta": false, "A": true, "Beta": false})
	if want := "p: Config fields must be positive: Beta, Zeta"; err == nil || err.Error() != want {
		t.Errorf("two checks fail: %v, want %q", err, want)
	}
}
