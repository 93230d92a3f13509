package etcd

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockwarden/lockwarden/internal/lock"
)

// Priority with aging (Request.Boost): see Queues in the package
// documentation. A waiter key's value starts with its place,
// "!" + 16 hex digits of its rank + 16 of its arrival (both µs, their sign
// bit flipped so that the bytes sort as the numbers do), then " " and the
// usual "T {json}". So the byte order of the values is the queue's order
// (rank, then arrival, then owner tag), and a transaction checks that no
// waiter is ahead of the caller with one range compare of the values.
// Values of earlier versions start with the owner tag (hex, after '!'):
// they are unranked.

// rankMark starts the value of a ranked waiter key.
const rankMark = '!'

// placeLen is the length of a place's encoding.
const placeLen = 1 + 16 + 16

// unranked is above every ranked value and every value of an earlier
// version: it sorts unranked waiters after the ranked ones.
const unranked = "~"

// place is a waiter's place in the queues of its keys: rank is its arrival
// less its Request.Boost, arrival the store-wide order it joined in (µs on
// the joining client's clock, above every arrival it read on its keys).
type place struct {
	rank, arrival int64
}

// encode is the place's prefix of a waiter value.
func (p place) encode() string {
	const flip = 1 << 63
	return fmt.Sprintf("%c%016x%016x", rankMark, uint64(p.rank)^flip, uint64(p.arrival)^flip) //nolint:gosec // G115: the bits are kept, the sign bit flipped
}

// encodeWaiter is a ranked waiter key's value.
func encodeWaiter(tag string, p place, rec waiterRecord) string {
	return p.encode() + " " + encodeValue(tag, rec)
}

// decodeWaiter reads a waiter key's value into its record and returns its
// place; ranked is false for a value of an earlier version (no place).
func decodeWaiter(v []byte, rec *waiterRecord) (p place, ranked bool, err error) {
	if len(v) > placeLen && v[0] == rankMark && v[placeLen] == ' ' {
		r, err1 := strconv.ParseUint(string(v[1:17]), 16, 64)
		a, err2 := strconv.ParseUint(string(v[17:placeLen]), 16, 64)
		if err1 != nil || err2 != nil {
			return p, false, fmt.Errorf("malformed waiter place in %q", v)
		}
		const flip = 1 << 63
		p, ranked, v = place{rank: int64(r ^ flip), arrival: int64(a ^ flip)}, true, v[placeLen+1:] //nolint:gosec // G115: as encode
	}
	_, err = decodeValue(v, rec)
	return p, ranked, err
}

// queued is one waiter key of a queue as read.
type queued struct {
	key string
	rev int64 // its CreateRevision: the arrival ticket Replace compares
	// order is the value for a ranked waiter, else unranked: the queue's
	// order is by order, then rev.
	order   string
	arrival int64
	// weight is the slots it asks for (1 when read without its value).
	weight int
}

// sortQueue reads a queue's waiter keys (with their values, or keys only:
// then all unranked) and orders them: ranked waiters by their values,
// then the unranked ones (of earlier versions) by CreateRevision.
func sortQueue(kvs []*mvccpb.KeyValue) ([]queued, error) {
	out := make([]queued, 0, len(kvs))
	for _, kv := range kvs {
		q := queued{key: string(kv.Key), rev: kv.CreateRevision, order: unranked, weight: 1}
		if len(kv.Value) > 0 {
			var rec waiterRecord
			p, ranked, err := decodeWaiter(kv.Value, &rec)
			if err != nil {
				return nil, err
			}
			q.weight = rec.slots()
			if ranked {
				q.order, q.arrival = string(kv.Value), p.arrival
			}
		}
		out = append(out, q)
	}
	slices.SortStableFunc(out, func(a, b queued) int {
		return cmp.Or(cmp.Compare(a.order, b.order), cmp.Compare(a.rev, b.rev))
	})
	return out, nil
}

// headBound is what an own waiter value is compared against: every waiter
// value of the queue above it means nobody is ranked ahead of the owner
// (its own value is above it too). "" for an unranked own value.
func headBound(value []byte) string {
	if len(value) <= placeLen || value[0] != rankMark {
		return ""
	}
	tag, _, _ := strings.Cut(string(value[placeLen+1:]), " ")
	return string(value[:placeLen+1]) + tag
}

// noRanked compares a queue to hold no ranked waiter: every value starts
// with an owner tag (hex), above rankMark.
func noRanked(qp, qend string) clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(qp).WithRange(qend), ">", string(rune(rankMark+1)))
}

// placeOf is the place of a waiter joining the queues of req's keys
// (views, as read): the one it has in any of them when it calls again;
// for a waiter of an earlier version its arrival is when it joined (no
// boost); else it arrives now (µs), after every arrival it read, and ranks
// that less its boost.
func (l *Locker) placeOf(req lock.Request, views []keyView, now time.Time) place {
	var (
		p           place
		found       bool
		last, since int64
	)
	for _, v := range views {
		last = max(last, v.last)
		switch {
		case v.ownRanked && (!found || v.ownPlace.arrival > p.arrival):
			p, found = v.ownPlace, true
		case v.own != nil && !v.ownRanked && v.own.Since > 0:
			since = max(since, v.own.Since)
		}
	}
	switch {
	case found:
		return p
	case since > 0:
		a := since * 1000
		return place{rank: a, arrival: a}
	}
	a := max(now.UnixMicro(), last+1)
	return place{rank: a - req.Boost.Microseconds(), arrival: a}
}
