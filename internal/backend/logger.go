package backend

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	goredis "github.com/redis/go-redis/v9"
)

// redisLogger routes go-redis's internal messages (connection pool dial
// failures, mostly) to a logr.Logger at V(2): the operator reports backend
// outages itself, through conditions, Events and metrics.
type redisLogger struct{ log logr.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.V(2).Info(fmt.Sprintf(format, v...))
}

// RouteRedisLogs sends go-redis's process-wide log output to log.
func RouteRedisLogs(log logr.Logger) { goredis.SetLogger(redisLogger{log: log}) }
