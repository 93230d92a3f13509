package redis

import (
	"context"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// TestMain silences go-redis's own logger: the tests kill nodes on purpose,
// and every failed dial would be printed. The engine's errors carry the causes.
func TestMain(m *testing.M) {
	goredis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}
