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
