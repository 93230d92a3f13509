package holder

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	cases := map[string]Holder{
		"manual holder":       {Cluster: "prod-eu", Lock: "billing", Kind: "DistributedLock", Namespace: "batch", Name: "billing", UID: "3f2a-1", Identity: "maintenance"},
		"identity with pipes": {Cluster: "c", Kind: "DistributedLock", Namespace: "ns", Name: "n", UID: "u", Identity: "a|b|c"},
		"job":                 {Cluster: "c", Lock: "billing", Kind: "Job", Namespace: "batch", Name: "nightly-1", UID: "abcdef", Identity: WorkloadIdentity("c", "batch", "Job", "nightly-1", "abcdef")},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(h, Decode(h.Encode())); diff != "" {
				t.Errorf("Decode(Encode()) (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestDecodeForeignHolder(t *testing.T) {
	if diff := cmp.Diff(Holder{Identity: "some-script-on-host-7"}, Decode("some-script-on-host-7")); diff != "" {
		t.Errorf("(-want,+got):\n%s", diff)
	}
}

func TestOwnerTokens(t *testing.T) {
	key := bytes.Repeat([]byte{7}, MinKeyLen)
	tk, err := NewTokens(key)
	if err != nil {
		t.Fatal(err)
	}
	h := Holder{Cluster: "c", Kind: "Job", Namespace: "ns", Name: "j", UID: "u1", Identity: "i"}
	a := tk.Owner(h)
	if len(a) != 32 {
		t.Fatalf("token %q has %d hex characters, want 32 (128 bits)", a, len(a))
	}
	other, _ := NewTokens(bytes.Repeat([]byte{8}, MinKeyLen))
	h2 := h
	h2.UID = "u2"
	for name, got := range map[string]string{"same holder again": tk.Owner(h)} {
		if got != a {
			t.Errorf("%s: token %q, want %q", name, got, a)
		}
	}
	for name, got := range map[string]string{"another UID": tk.Owner(h2), "another key": other.Owner(h)} {
		if got == a {
			t.Errorf("%s: token equals the first holder's", name)
		}
	}
	if _, err := NewTokens([]byte("short")); err == nil {
		t.Error("NewTokens accepted a 5-byte key")
	}
}

// TestForceReleaseSeals: a seal verifies only for the request it was made
// for, under the key it was made with; moving any field (or a byte between
// two fields) breaks it.
func TestForceReleaseSeals(t *testing.T) {
	tk, err := NewTokens(bytes.Repeat([]byte{7}, MinKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewTokens(bytes.Repeat([]byte{8}, MinKeyLen))
	seal := tk.ForceReleaseSeal("team-a", "billing", "42", "oncall@example.com")
	if !tk.VerifyForceReleaseSeal("team-a", "billing", "42", "oncall@example.com", seal) {
		t.Fatal("the seal does not verify for its own request")
	}
	if seal == tk.Owner(Holder{Identity: "team-a/billing/42/oncall@example.com"}) {
		t.Fatal("a seal equals an owner token")
	}
	type req struct{ ns, lock, token, user string }
	for name, r := range map[string]req{
		"another namespace":             {"team-b", "billing", "42", "oncall@example.com"},
		"another lock":                  {"team-a", "ledger", "42", "oncall@example.com"},
		"another token":                 {"team-a", "billing", "43", "oncall@example.com"},
		"another user":                  {"team-a", "billing", "42", "mallory@example.com"},
		"a byte moved between fields":   {"team-a", "billin", "g42", "oncall@example.com"},
		"the user moved into the token": {"team-a", "billing", "42oncall@example.com", ""},
	} {
		if tk.VerifyForceReleaseSeal(r.ns, r.lock, r.token, r.user, seal) {
			t.Errorf("%s: the seal verifies", name)
		}
	}
	if other.VerifyForceReleaseSeal("team-a", "billing", "42", "oncall@example.com", seal) {
		t.Error("a seal made with another key verifies")
	}
	for _, forged := range []string{"", "00", seal[:len(seal)-1]} {
		if tk.VerifyForceReleaseSeal("team-a", "billing", "42", "oncall@example.com", forged) {
			t.Errorf("the forged seal %q verifies", forged)
		}
	}
}
