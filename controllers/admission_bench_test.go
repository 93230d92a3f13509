package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/internal/testutil/redistest"
)

// BenchmarkJobCreate measures the latency of creating a Job through the API
// server: a gated Job (through the admission webhook) against an unrelated
// one (which matchConditions keep away from the webhook). The difference is
// what the webhook adds. Reports p50 and p99 per create.
//
//	go test ./controllers -run '^$' -bench BenchmarkJobCreate -benchtime 300x
func BenchmarkJobCreate(b *testing.B) {
	rdb := redistest.Start(b)
	startManager(b, managerOptions{})
	ns := newNamespace(b, nil)
	if err := env.Client.Create(context.Background(), makeLock("billing", ns, rdb.Addr).obj()); err != nil {
		b.Fatal(err)
	}
	for _, gated := range []bool{true, false} {
		name := "unrelated"
		if gated {
			name = "gated"
		}
		b.Run(name, func(b *testing.B) {
			samples := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				jb := makeJob(fmt.Sprintf("%s-%d-%d", name, b.N, i), ns)
				if gated {
					jb = jb.lock("billing")
				}
				j := jb.obj()
				start := time.Now()
				if err := env.Client.Create(context.Background(), j); err != nil {
					b.Fatal(err)
				}
				samples = append(samples, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(samples)
			b.ReportMetric(float64(samples[len(samples)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(samples[len(samples)*99/100].Microseconds()), "p99-µs")
		})
	}
}
